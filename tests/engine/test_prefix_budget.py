"""Shared prefixes live under the session budgets and the per-group share (engine/kv/prefix_index.py says how).

A prefix is charged to the group whose prompt made it until a second group uses it; then it is shared: no group's
share counts it and the pool's LRU evicts it. So a stranger opening conversation after conversation evicts their
own oldest prefixes, not a prefix everyone uses, and cannot pin their own by using it again.
"""
from engine import greedy

from .helpers import image, run_until_done

EXAMPLE = [{"role": "user", "content": [{"type": "image", "image": image(40, (64, 64))},
                                        {"type": "text", "text": "What is in this example picture?"}]}]


def ask(engine, messages, group, conv=None):
    handle = engine.add_request(messages, greedy(4), session_id=conv, group=group)
    run_until_done(engine)
    return handle.result(0)


def crowd_question(i: int):
    return [{"role": "user", "content": [{"type": "image", "image": image(60 + i, (64, 64))},
                                         {"type": "text", "text": f"Tell me about picture {i}."}]}]


def shared_entries(engine):
    return [(key, entry) for key, entry, _ in engine.sessions.entries.items() if key.startswith("prefix:shared:")]


def example_after_a_crowd(make_engine, share: float, budget_mb: float):
    engine = make_engine("lfm2vl", session_budget_mb=budget_mb, session_group_share=share)
    ask(engine, EXAMPLE, "198.51.100.7")
    assert ask(engine, EXAMPLE, "192.0.2.44").stats.cached_tokens > 0  # a second group: the prefix is shared now
    assert [entry.group for _, entry in shared_entries(engine)] == [None]
    for i in range(8):  # another network opens one conversation after another
        ask(engine, crowd_question(i), "203.0.113.9", conv=f"crowd-{i}")
    crowd = sum(held["device"] for _, entry, held in engine.sessions.entries.items() if entry.group == "203.0.113.9")
    assert crowd <= share * engine.sessions.entries.budgets["device"]
    return ask(engine, EXAMPLE, "100.64.0.1")


def test_a_crowd_cannot_evict_a_prefix_others_share(make_engine):
    probe = make_engine("lfm2vl")
    ask(probe, crowd_question(0), "someone", conv="one")
    one_conversation_mb = probe.stats()["session_bytes"] / 2**20  # its session entry, its prefix, the head
    budget_mb = one_conversation_mb * 3.5
    kept = example_after_a_crowd(make_engine, share=0.5, budget_mb=budget_mb)
    assert kept.stats.cached_tokens == kept.stats.prompt_tokens - 1
    flushed = example_after_a_crowd(make_engine, share=1.0, budget_mb=budget_mb)
    assert flushed.stats.cached_tokens < flushed.stats.prompt_tokens - 1


def test_a_group_using_its_own_prefix_again_keeps_paying_for_it(make_engine):
    engine = make_engine("lfm2vl")
    for _ in range(3):
        ask(engine, EXAMPLE, "203.0.113.9")
    assert [entry.group for _, entry in shared_entries(engine)] == ["203.0.113.9"]
    assert engine.stats()["shared_prefix_hits"] == 2
