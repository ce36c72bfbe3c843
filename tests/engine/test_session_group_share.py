"""One group's conversations hold at most its share of the session cache, so they cannot flush everyone else's.

The unit tests drive ``SessionStore`` with synthetic snapshots; the last one runs real conversations through the
engine on the tiny LFM2-VL and checks that a bystander's follow-up is still served from its cache while another
group runs many conversations, and that it would not be without the share.
"""
import torch

from engine import greedy
from engine.kv.kv_cache import CacheSnapshot
from engine.kv.session_store import SessionStore

from .helpers import image, run_until_done

CPU = torch.device("cpu")


def snapshot(length: int = 40, seed: int = 0) -> CacheSnapshot:
    g = torch.Generator().manual_seed(seed)
    kv = {i: (torch.randn(1, 2, length, 16, generator=g), torch.randn(1, 2, length, 16, generator=g)) for i in (0, 1)}
    return CacheSnapshot(kv, {}, length)


ENTRY_BYTES = 2 * 2 * (2 * 40 * 16) * 4  # two layers' K and V, [1, 2, 40, 16] fp32


def store(entries_held: float, share: float) -> SessionStore:
    return SessionStore(int(ENTRY_BYTES * entries_held), text_config=None, device=CPU, model_dtype=torch.float32,
                        group_share=share)


def put(s: SessionStore, key: str, group: str | None, seed: int = 0) -> None:
    snap = snapshot(seed=seed)
    s._put(key, list(range(snap.length)), snap, {}, group=group)


def test_a_group_past_its_share_evicts_its_own_oldest_not_others():
    s = store(entries_held=8, share=0.25)  # two entries each
    put(s, "bystander", "10.0.0.1")
    for i in range(6):
        put(s, f"crowd-{i}", "203.0.113.9", seed=i)
    assert s.entries.keys() == ["bystander", "crowd-4", "crowd-5"]
    assert s.stats()["session_group_evictions"] == 4 and s.stats()["session_evictions"] == 0


def test_without_the_share_the_same_crowd_evicts_the_bystander():
    s = store(entries_held=4, share=1.0)
    put(s, "bystander", "10.0.0.1")
    for i in range(6):
        put(s, f"crowd-{i}", "203.0.113.9", seed=i)
    assert "bystander" not in s.entries.keys()


def test_replacing_a_conversation_entry_does_not_count_its_old_bytes():
    s = store(entries_held=8, share=0.25)
    put(s, "a", "alice")
    for turn in range(5):  # the same conversation, turn after turn
        put(s, "b", "alice", seed=turn)
    assert s.entries.keys() == ["a", "b"] and s.stats()["session_group_evictions"] == 0


def test_an_entry_larger_than_the_share_is_not_kept_and_evicts_nothing():
    s = store(entries_held=3, share=0.25)  # a share of 0.75 entry
    put(s, "mine", "bob")
    assert s.entries.keys() == [] and s.stats()["session_group_refusals"] == 1
    put(s, "theirs", None)  # shared entries (the template head) are not a group's
    assert s.entries.keys() == ["theirs"]


def test_an_entry_that_needs_room_takes_it_only_from_the_same_group():
    s = store(entries_held=4, share=0.5)  # two entries each, four in all
    put(s, "x1", "x")
    put(s, "y1", "y")
    put(s, "x2", "x")
    put(s, "y2", "y")
    put(s, "x3", "x")
    assert s.entries.keys() == ["y1", "x2", "y2", "x3"]


def _turn(engine, conv: str, group: str, history: list, text: str, img=None):
    content = ([{"type": "image", "image": img}] if img is not None else []) + [{"type": "text", "text": text}]
    history.append({"role": "user", "content": content})
    handle = engine.add_request(history, greedy(4), session_id=conv, group=group)
    run_until_done(engine)
    result = handle.result(0)
    history.append({"role": "assistant", "content": [{"type": "text", "text": result.text}]})
    return result


def _bystander_follow_up_source(make_engine, share: float, budget_mb: float) -> str | None:
    engine = make_engine("lfm2vl", session_budget_mb=budget_mb, session_group_share=share)
    mine: list = []
    _turn(engine, "mine", "198.51.100.7", mine, "What is in this picture?", image(5, (64, 64)))
    for i in range(8):  # another network opens one conversation after another
        _turn(engine, f"crowd-{i}", "203.0.113.9", [], f"Tell me about picture {i}.", image(20 + i, (64, 64)))
    return _turn(engine, "mine", "198.51.100.7", mine, "And its colour?").stats.cache_source


def test_a_crowd_of_conversations_from_one_network_leaves_a_bystanders_cache(make_engine):
    probe = make_engine("lfm2vl")
    _turn(probe, "one", "someone", [], "What is in this picture?", image(5, (64, 64)))
    one_entry_mb = max(probe.stats()["session_bytes"], 1) / 2**20  # one conversation and the template head
    budget_mb = one_entry_mb * 4.5
    assert _bystander_follow_up_source(make_engine, share=0.5, budget_mb=budget_mb) == "session"
    assert _bystander_follow_up_source(make_engine, share=1.0, budget_mb=budget_mb) != "session"
