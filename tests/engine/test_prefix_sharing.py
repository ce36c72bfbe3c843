"""Prefixes shared across conversations (engine/kv/prefix_index.py) must not change what the model says.

Every family and both decode batches, fp32, against per-request generate(): a new conversation with the same
system prompt, picture and question as another (the whole prompt but its last token is restored); the same system
prompt and picture with another question (restored up to the picture's end at least); the same question with
another picture (only the template head); two new conversations with the same prompt admitted in one step.
"""
import pytest

from engine import greedy

from .helpers import image, run_until_done
from .test_families import reference


def reference_tokens(runner, messages, n: int) -> list[int]:
    """generate() on the processor's own chat template ids (every family's, test_families.py)."""
    return reference(runner, messages, n)

SYSTEM = {"role": "system",
          "content": [{"type": "text", "text": "You are a careful assistant who describes pictures."}]}
CASES = [("lfm2vl", "slots"), ("lfm2vl", "dynamic"), ("llava", "slots"), ("llava", "dynamic"),
         ("qwen2vl", "dynamic"), ("qwen2_5vl", "dynamic"), ("qwen3vl", "dynamic"), ("gemma3", "dynamic"),
         ("mistral3", "dynamic"), ("idefics3", "dynamic"), ("smolvlm", "dynamic"), ("internvl", "dynamic")]


def conversation(question: str, picture, system: bool = True) -> list[dict]:
    user = {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": question}]}
    return [SYSTEM, user] if system else [user]


def ask(engine, messages, conv: str, group: str, n: int = 6):
    handle = engine.add_request(messages, greedy(n), session_id=conv, group=group)
    run_until_done(engine)
    return handle.result(0)


def image_end(engine, messages) -> int:
    prompt = engine.prompts.build(messages)
    return max(i for i, t in enumerate(prompt.token_ids) if t == engine.runner.image_token_id) + 1


@pytest.mark.parametrize("fam, decode_batch", CASES)
def test_shared_prefixes_match_generate(fam, decode_batch, make_engine, runners):
    runner = runners(fam)
    system = fam != "gemma3"  # its template folds a system prompt into the first user turn: no separate head
    eng = make_engine(fam, decode_cache=decode_batch)
    picture, other = image(3, (64, 56)), image(4, (56, 64))
    same = conversation("What colour is the circle?", picture, system)
    first = ask(eng, same, "a", "g1")
    again = ask(eng, same, "b", "g2")
    question = conversation("Where is it in the picture?", picture, system)
    partial = ask(eng, question, "c", "g3")
    stranger = conversation("What colour is the circle?", other, system)
    unrelated = ask(eng, stranger, "d", "g4")
    for messages, result in [(same, first), (same, again), (question, partial), (stranger, unrelated)]:
        assert result.token_ids == reference_tokens(runner, messages, 6), messages[-1]["content"][-1]["text"]
    assert first.stats.cached_tokens < image_end(eng, same)
    assert again.stats.cache_source == "prefix" and again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert partial.stats.cached_tokens >= image_end(eng, question)
    # another picture: nothing past its first image token (the text before it may be shared)
    assert unrelated.stats.cached_tokens <= image_end(eng, stranger) - runner_image_tokens(eng, stranger)
    assert eng.stats()["shared_prefix_hits"] == 2


def runner_image_tokens(engine, messages) -> int:
    return sum(img.num_image_tokens for img in engine.prompts.build(messages).images)


@pytest.mark.parametrize("fam, decode_batch", [("lfm2vl", "slots"), ("llava", "dynamic"), ("qwen2vl", "dynamic")])
def test_new_conversations_with_one_prompt_in_the_same_step(fam, decode_batch, make_engine, runners):
    """Admitted together, neither finds the other's prefix yet: both prefill, both exact; a third one later
    restores it."""
    eng = make_engine(fam, decode_cache=decode_batch)
    messages = conversation("Is there a circle?", image(7, (64, 64)), fam != "gemma3")
    handles = [eng.add_request(messages, greedy(6), session_id=f"s{i}", group=f"g{i}") for i in range(2)]
    run_until_done(eng)
    want = reference_tokens(runners(fam), messages, 6)
    assert [h.result(0).token_ids for h in handles] == [want, want]
    later = ask(eng, messages, "s2", "g2")
    assert later.token_ids == want and later.stats.cached_tokens == later.stats.prompt_tokens - 1


@pytest.mark.parametrize("fam", ["lfm2vl", "llava"])
def test_batched_prefill_keeps_shared_prefixes_exact(fam, make_engine, runners):
    """Batched prefill (engine/batch/prefill_batch.py): two new conversations with one picture and different questions
    in one forward, then a third about the same picture. Full attention keeps the prefix from a batched row (a
    slice of its K/V); a hybrid model's rows do not pause inside a batched forward, so nothing past the head is
    kept from them (the third recomputes the picture), and every answer is exact either way."""
    eng = make_engine(fam, batched_prefill="on")
    picture = image(9, (64, 64))
    chats = [conversation(q, picture) for q in ("What is it?", "Which colour is the background?")]
    handles = [eng.add_request(m, greedy(5), session_id=f"s{i}", group=f"g{i}") for i, m in enumerate(chats)]
    run_until_done(eng)
    for m, h in zip(chats, handles):
        assert h.result(0).token_ids == reference_tokens(runners(fam), m, 5)
    assert eng.stats()["prefill_batched_rows"] >= 2
    third = conversation("Is it round?", picture)
    result = ask(eng, third, "s3", "g3", 5)
    assert result.token_ids == reference_tokens(runners(fam), third, 5)
    kept = result.stats.cached_tokens >= image_end(eng, third)
    assert kept == (fam == "llava")


def test_follow_ups_keep_using_their_own_session(make_engine, runners):
    """A conversation that restored a shared prefix goes on with its own session entry, exact."""
    eng = make_engine("lfm2vl")
    picture = image(5, (64, 64))
    ask(eng, conversation("What colour is the circle?", picture), "a", "g1")
    history = conversation("What colour is the circle?", picture)
    first = ask(eng, history, "b", "g2")
    history = history + [{"role": "assistant", "content": first.text},
                         {"role": "user", "content": "And its size?"}]
    follow = ask(eng, history, "b", "g2")
    assert follow.stats.cache_source == "session"
    assert follow.token_ids == reference_tokens(runners("lfm2vl"), history, 6)


def test_sharing_off_recomputes(make_engine):
    eng = make_engine("llava", shared_prefixes=False)
    messages = conversation("What colour is the circle?", image(3, (64, 56)))
    ask(eng, messages, "a", "g1")
    assert ask(eng, messages, "b", "g2").stats.cached_tokens < image_end(eng, messages)
