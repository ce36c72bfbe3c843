"""Admission restores the session cache before the scheduler budgets prefill tokens.

A session hit is charged only the tokens it really prefills, so a follow-up whose whole history would not fit
one step's budget, and a fresh prompt that arrives with it, are both prefilled in the same step — and still give
exactly the tokens of ``generate()``.
"""
from engine import greedy
from engine.request import Status

from .helpers import image, reference_tokens, run_until_done

BUDGET = 64  # prompt tokens per step: less than the follow-up's whole history, more than what is new in it


def test_session_hit_and_fresh_prompt_are_prefilled_in_the_same_step(family, make_engine, runners):
    eng = make_engine(family, max_prefill_tokens=BUDGET)
    first = [{"role": "user", "content": [{"type": "image", "image": image(21, (256, 224))},
                                          {"type": "text", "text": "What is in the picture?"}]}]
    answer = eng.add_request(first, greedy(6), session_id="conv")
    run_until_done(eng)
    follow = first + [{"role": "assistant", "content": [{"type": "text", "text": answer.result(0).text}]},
                      {"role": "user", "content": [{"type": "text", "text": "And its colour?"}]}]
    fresh = [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]

    h_follow = eng.add_request(follow, greedy(6), session_id="conv")
    h_fresh = eng.add_request(fresh, greedy(6), session_id="other")
    eng.step()  # one step: admission (restoring the session), prefill within budget, one decode

    follow_req, fresh_req = (eng._live[h.request_id] for h in (h_follow, h_fresh))
    assert follow_req.prompt_len > BUDGET, "the test needs a history that would not fit one step uncached"
    new_tokens = follow_req.prompt_len - follow_req.cached_tokens + fresh_req.prompt_len - fresh_req.cached_tokens
    assert follow_req.cache_source == "session" and new_tokens <= BUDGET, (follow_req.cached_tokens, new_tokens)
    # Both finished their prompt in this one step and are decoding.
    assert follow_req.status is Status.RUNNING and fresh_req.status is Status.RUNNING
    assert follow_req.remaining_prefill == 0 and fresh_req.remaining_prefill == 0

    run_until_done(eng)
    assert h_follow.result(0).token_ids == reference_tokens(runners(family), follow, 6)
    assert h_fresh.result(0).token_ids == reference_tokens(runners(family), fresh, 6)


def test_a_prompt_longer_than_the_budget_is_still_chunked(family, make_engine, runners):
    """The budget still holds for what is not cached: a long uncached prompt takes several steps."""
    eng = make_engine(family, max_prefill_tokens=16, session_cache=False)
    msgs = [{"role": "user", "content": [{"type": "image", "image": image(22, (64, 64))},
                                         {"type": "text", "text": "Describe it."}]}]
    h = eng.add_request(msgs, greedy(4))
    eng.step()
    req = eng._live[h.request_id]
    assert req.status is Status.PREFILLING and req.num_computed == 16
    run_until_done(eng)
    assert h.result(0).token_ids == reference_tokens(runners(family), msgs, 4)
