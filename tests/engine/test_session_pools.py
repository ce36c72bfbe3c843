"""Session bytes are accounted per pool: on the compute device and parked in host memory, each with its budget.

These run on CPU. The store is told its compute device is CUDA (nothing is ever moved there in these tests),
so that parked entries — quantised K/V and their full-precision conv states — must land in the host pool.
"""
import torch

from engine.kv.byte_lru import ByteLRU
from engine.kv.kv_cache import CacheSnapshot
from engine.kv.session_store import SessionStore

ACCELERATOR = torch.device("cuda")  # only compared with, never allocated on


def snapshot(length: int = 40, layers=(0, 2), conv_layers=(1,), seed: int = 0) -> CacheSnapshot:
    g = torch.Generator().manual_seed(seed)
    kv = {i: (torch.randn(1, 2, length, 16, generator=g), torch.randn(1, 2, length, 16, generator=g)) for i in layers}
    conv = {i: torch.randn(1, 32, 3, generator=g) for i in conv_layers}
    return CacheSnapshot(kv, conv, length)


def store(mode: str, device_budget: int, host_budget: int) -> SessionStore:
    return SessionStore(device_budget, text_config=None, device=ACCELERATOR, model_dtype=torch.float32,
                        park_mode=mode, group_size=16, host_budget_bytes=host_budget)


def test_parked_entries_live_in_host_memory_conv_states_included():
    s = store("int8", device_budget=0, host_budget=1 << 20)
    snap = snapshot()
    s._put("conv-a", list(range(snap.length)), snap, {snap.length: snap.conv})
    entry = s.entries.get("conv-a")
    assert entry is not None, "a parked entry must not be refused by the (empty) device budget"
    assert all(t.device.type == "cpu" for ck in entry.conv_checkpoints.values() for t in ck.values())
    assert all(t.device.type == "cpu" for kv in entry.kv.values() for t in kv)
    stats = s.stats()
    assert stats["session_device_bytes"] == 0 and stats["session_host_bytes"] == entry.nbytes > 0
    conv_bytes = sum(t.nbytes for t in snap.conv.values())
    assert entry.nbytes > conv_bytes  # the conv state is counted in host bytes with the quantised K/V


def test_host_budget_limits_parked_entries_and_not_the_device_budget():
    one = store("int4", device_budget=1 << 30, host_budget=1 << 30)
    snap = snapshot()
    one._put("a", list(range(snap.length)), snap, {snap.length: snap.conv})
    size = one.entries.get("a").nbytes
    s = store("int4", device_budget=1 << 30, host_budget=int(size * 1.5))  # room for one parked entry
    for key in ("a", "b"):
        snap = snapshot(seed=ord(key))
        s._put(key, list(range(snap.length)), snap, {snap.length: snap.conv})
    assert s.entries.keys() == ["b"] and s.stats()["session_evictions"] == 1


def test_each_pool_evicts_only_its_own_entries():
    lru = ByteLRU({"device": 100, "host": 100})
    lru.put("d1", "x", {"device": 60})
    lru.put("h1", "y", {"host": 60})
    lru.put("d2", "z", {"device": 60})  # over the device budget: the oldest device entry goes, not h1
    assert lru.keys() == ["h1", "d2"] and lru.held == {"device": 60, "host": 60}
    assert lru.put("big", "w", {"host": 101}) == [] and "big" not in lru  # larger than its pool: not stored
    single = ByteLRU(100)
    single.put("a", 1, 70)
    assert single.put("b", 2, 70) == [("a", 1)] and single.bytes_held == 70 and single.budget == 100
