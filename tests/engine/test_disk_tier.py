"""The disk tier: a conversation resumed from files after its engine is gone gives the tokens generate() gives,
files that cannot be trusted are dropped (the turn recomputed), and the folder stays within its bound."""
import os
import shutil

import pytest
import torch

from engine import greedy
from engine.kv import entry_file
from engine.kv.disk_tier import DiskTier, FolderInUse
from engine.kv.entry_file import Identity
from engine.kv.kv_quant import park_kv
from engine.kv.session_store import SessionEntry

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


def test_a_folder_named_from_home_is_the_one_under_home(tmp_path, monkeypatch):
    """OWLET_DISK_CACHE_DIR=~/owlet-kv, as a .env file leaves it: the tier made a folder named "~" wherever the worker
    was started, and a restart from another folder found none of it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    tier = DiskTier("~/owlet-kv", 2**20, Identity("m", "float32", "none/64/f1"))
    tier.close()
    assert tier.folder == tmp_path / "home" / "owlet-kv" and tier.folder.is_dir()
    assert not (tmp_path / "~").exists()


def test_untrustworthy_files_are_dropped_and_every_turn_is_answered_right(make_engine, runners, tmp_path):
    """Truncated, corrupt, another model's, another dtype's, another conversation's, torn: each is dropped and its
    follow-up recomputed; the intact file is served. Every answer equals generate() in fp32."""
    folder, foreign = tmp_path / "lfm2", tmp_path / "llava"
    first = make_engine("lfm2vl", disk_cache_dir=str(folder))
    convs = [f"c{i}" for i in range(6)]
    histories = {}
    for conv in convs:
        prompts, results = converse(first, conv, turns=TURNS[:2])
        histories[conv] = history_of(prompts, results)
    first.stop()
    other = make_engine("llava", disk_cache_dir=str(foreign))
    converse(other, "c2", turns=TURNS[:2])
    other.stop()

    tier = DiskTier.__new__(DiskTier)  # for its file names only: the folder is not opened
    tier.folder = folder
    path = {conv: tier._path(conv) for conv in convs}
    with open(path["c0"], "r+b") as f:  # truncated
        f.truncate(os.path.getsize(path["c0"]) // 2)
    data = bytearray(path["c1"].read_bytes())  # one flipped bit in the payload
    data[len(data) // 2] ^= 0x10
    path["c1"].write_bytes(bytes(data))
    shutil.copy(foreign / path["c2"].name, path["c2"])  # another model's file for the same conversation
    header = entry_file.read_header(str(path["c3"]))  # a well-formed file, written for bfloat16
    ident = Identity(header["model"], header["dtype"], header["layout"])
    fields = entry_file.read(str(path["c3"]), "c3", ident)
    entry_file.write_parts(str(path["c3"]), entry_file.encode(
        "c3", SessionEntry(**fields), Identity(ident.model, "bfloat16", ident.layout)))
    shutil.copy(path["c5"], path["c4"])  # another conversation's file under this one's name
    (folder / (path["c5"].name + ".123.tmp")).write_bytes(b"torn")  # a write a crash cut short

    second = make_engine("lfm2vl", disk_cache_dir=str(folder))
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())
    for conv in convs:
        messages, result = follow_up(second, conv, histories[conv], "What else is there?")
        assert result.token_ids == reference_tokens(runners("lfm2vl"), messages, 8), conv
        assert (result.stats.cache_source == "disk") == (conv == "c5"), (conv, result.stats.cache_source)
    assert second.stats()["disk_dropped"] >= 5


def test_the_folder_never_exceeds_its_bound(make_engine, tmp_path, monkeypatch):
    # conversations only (no shared prefix entries beside them), so the budget is counted in conversations' files
    probe = make_engine("llava", disk_cache_dir=str(tmp_path / "probe"), shared_prefixes=False)
    converse(probe, "c", turns=TURNS[:2])
    probe.stop()
    one = folder_bytes(tmp_path / "probe")
    budget_mb = 2.5 * one / 2**20
    folder = tmp_path / "bounded"
    peaks = []
    write = entry_file.write_parts

    def checked_write(path, parts):  # the moment the most is held: the old file and the new one side by side
        peaks.append(folder_bytes(folder) + entry_file.size_of(parts))
        write(path, parts)

    monkeypatch.setattr(entry_file, "write_parts", checked_write)
    eng = make_engine("llava", disk_cache_dir=str(folder), disk_cache_mb=budget_mb, shared_prefixes=False)
    for i in range(5):
        converse(eng, f"c{i}", turns=TURNS[:2])
        assert eng.sessions.disk.flush()
        assert folder_bytes(folder) <= budget_mb * 2**20
    assert peaks and max(peaks) <= budget_mb * 2**20
    stats = eng.stats()
    assert stats["disk_evictions"] >= 3 and stats["disk_files"] == 2 and stats["disk_bytes"] == folder_bytes(folder)


def test_a_file_slower_to_read_than_to_recompute_is_not_read(make_engine, runners, tmp_path):
    first = make_engine("llava", disk_cache_dir=str(tmp_path))
    prompts, results = converse(first, "c", turns=TURNS[:2])
    first.stop()
    second = make_engine("llava", disk_cache_dir=str(tmp_path))
    second.sessions.disk.read_bytes_per_s, second.sessions.disk.prefill_tokens_per_s = 1.0, 1e9
    messages, result = follow_up(second, "c", history_of(prompts, results), "What else is there?")
    assert result.stats.cache_source != "disk"
    assert result.token_ids == reference_tokens(runners("llava"), messages, 8)
    assert second.stats()["disk_skipped_slower"] >= 1  # the conversation (and the template head)


def test_a_quantised_entry_resumed_from_disk_answers_as_the_parked_one_in_memory(make_engine, tmp_path):
    """int8 parking is lossy by design; the file adds nothing to it: the codes and scales come back bit for bit."""
    kept = make_engine("lfm2vl", park_mode="int8")
    prompts, results = converse(kept, "c", turns=TURNS[:2])
    _, in_memory = follow_up(kept, "c", history_of(prompts, results), "What else is there?")
    first = make_engine("lfm2vl", park_mode="int8", disk_cache_dir=str(tmp_path))
    prompts, results = converse(first, "c", turns=TURNS[:2])
    first.stop()
    second = make_engine("lfm2vl", park_mode="int8", disk_cache_dir=str(tmp_path))
    _, from_disk = follow_up(second, "c", history_of(prompts, results), "What else is there?")
    assert from_disk.stats.cache_source == "disk" and in_memory.stats.cache_source == "session"
    assert from_disk.token_ids == in_memory.token_ids
    assert from_disk.stats.cached_tokens == in_memory.stats.cached_tokens
