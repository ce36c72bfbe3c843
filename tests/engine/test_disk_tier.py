"""The disk tier: a conversation resumed from files after its engine is gone gives the tokens generate() gives,
files that cannot be trusted are dropped (the turn recomputed), and the folder stays within its bound."""
import os
import shutil

import pytest
import torch

from engine import entry_file, greedy
from engine.disk_tier import DiskTier, FolderInUse
from engine.entry_file import Identity
from engine.kv_quant import park_kv
from engine.session_store import SessionEntry

from .helpers import reference_tokens, run_until_done
from .test_sessions import TURNS, converse


def folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name != "owlet.lock")


def entry_files(folder) -> list:
    return sorted(p for p in folder.iterdir() if p.suffix == ".kv")


def follow_up(engine, session_id, history, text, n=8):
    """One more turn after ``history`` (messages with the answers); returns (its messages, its result)."""
    messages = history + [{"role": "user", "content": [{"type": "text", "text": text}]}]
    h = engine.add_request(messages, greedy(n), session_id=session_id)
    run_until_done(engine)
    return messages, h.result(0)


def history_of(prompts, results) -> list:
    return prompts[-1] + [{"role": "assistant", "content": [{"type": "text", "text": results[-1].text}]}]


def test_a_follow_up_after_a_restart_is_served_from_disk_token_exact(family, make_engine, runners, tmp_path):
    """Hybrid (LFM2: conv checkpoints) and attention-only (LLaVA: K/V slices) alike."""
    first = make_engine(family, disk_cache_dir=str(tmp_path))
    prompts, results = converse(first, "conv-1", turns=TURNS[:2])
    first.stop()  # writes what is waiting and lets the folder go, as a worker's shutdown does
    second = make_engine(family, disk_cache_dir=str(tmp_path))
    assert "conv-1" in second.stats()["disk_sessions"]
    messages, result = follow_up(second, "conv-1", history_of(prompts, results), "What else is there?")
    assert result.stats.cache_source == "disk" and result.stats.cached_tokens > 20
    assert result.token_ids == reference_tokens(runners(family), messages, 8)
    assert second.stats()["disk_hits"] == 1


def test_disk_entries_round_trip_quantised_and_full(tmp_path):
    torch.manual_seed(0)
    k, v = torch.randn(1, 2, 37, 16), torch.randn(1, 2, 37, 16)
    for mode in ("none", "int8", "int4"):
        entry = SessionEntry([1, 2, 3], {0: (park_kv(k, mode, 32, per_channel=mode != "none"), park_kv(v, mode, 32))},
                             {3: {1: torch.randn(1, 8, 3)}}, hybrid=True, group="g")
        ident = Identity("m", "float32", f"{mode}/32/f1")
        path = str(tmp_path / f"{mode}.kv")
        entry_file.write_parts(path, entry_file.encode("key", entry, ident))
        back = SessionEntry(**entry_file.read(path, "key", ident))
        assert (back.token_ids, back.hybrid, back.group) == ([1, 2, 3], True, "g")
        for a, b in zip(entry.tensors(), back.tensors()):
            da = a if isinstance(a, torch.Tensor) else a.dequantize()
            db = b if isinstance(b, torch.Tensor) else b.dequantize()
            assert torch.equal(da, db)
        for other in (Identity("m2", "float32", ident.layout), Identity("m", "bfloat16", ident.layout)):
            with pytest.raises(entry_file.BadEntryFile):
                entry_file.read(path, "key", other)
        with pytest.raises(entry_file.BadEntryFile):
            entry_file.read(path, "another key", ident)


def test_a_second_tier_on_the_same_folder_is_refused(tmp_path):
    ident = Identity("m", "float32", "none/64/f1")
    first = DiskTier(tmp_path, 2**20, ident)
    with pytest.raises(FolderInUse, match="in use by another process"):
        DiskTier(tmp_path, 2**20, ident)
    first.close()
    DiskTier(tmp_path, 2**20, ident).close()  # let go: the next one opens it
