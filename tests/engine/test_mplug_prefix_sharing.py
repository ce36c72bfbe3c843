"""mPLUG-Owl3 (engine/models/mplug_owl3/): prefixes shared across conversations match its plain reference forward.

Its images are cross-attended by the tokens after them, so a shared prefix's self-attention K/V depends on the
pictures inside it (the key includes their hashes); the new conversation's own image K/V are computed as usual.
"""
from engine import greedy

from .helpers import image, run_until_done
from .test_mplug_owl3 import folder, layout, make_engine, reference, runner, user  # noqa: F401 — fixtures

SYSTEM = {"role": "system", "content": "You describe pictures."}


def ask(engine, messages, conv, group, n=6):
    handle = engine.add_request(messages, greedy(n), session_id=conv, group=group)
    run_until_done(engine)
    return handle.result(0)


def test_shared_prefixes_match_reference(make_engine):
    eng = make_engine()
    picture = image(31, (64, 64))
    same = [SYSTEM, user(picture, "What colour is the circle?")]
    other_question = [SYSTEM, user(picture, "Where is it?")]
    other_picture = [SYSTEM, user(image(32, (64, 64)), "What colour is the circle?")]
    results = [(m, ask(eng, m, f"c{i}", f"g{i}")) for i, m in enumerate([same, same, other_question, other_picture])]
    for messages, result in results:
        assert result.token_ids == reference(eng, messages, 6)
    first, again, partial, stranger = (r for _, r in results)
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1
    image_token = eng.prompts.build(same).token_ids.index(eng.runner.image_token_id)
    assert partial.stats.cached_tokens > image_token
    assert stranger.stats.cached_tokens <= image_token


def test_same_prompt_in_one_step(make_engine):
    eng = make_engine()
    messages = [user(image(33, (64, 64)), "Is there a circle?")]
    handles = [eng.add_request(messages, greedy(6), session_id=f"s{i}", group=f"g{i}") for i in range(2)]
    run_until_done(eng)
    want = reference(eng, messages, 6)
    assert [h.result(0).token_ids for h in handles] == [want, want]
