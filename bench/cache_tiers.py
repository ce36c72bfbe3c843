"""Cache tiers benchmark: what the disk tier saves after a restart, and how many sessions it holds per GB of host
memory.

K conversations about their own image (about 256 image tokens) over the bench's "small" random-init LFM2-VL, one
request at a time, sessions parked as int8 (``park_mode``, as the disk tier stores them). In one run:

1. **Restart**: each conversation answers two turns on an engine with a disk tier; the engine is stopped and a new
   one opened on the same folder (the page cache is told to drop the files first, ``posix_fadvise``, so reads come
   from the disk). Each conversation's third turn is timed there (served from disk) and on an engine that
   recomputes it from history (no session cache, no image feature cache): TTFT ratio, target <= 0.35.
2. **Read vs prefill per token**: the disk read of each entry (cold, timed around ``DiskTier.get``) per token it
   covers, against the recompute's prefill time per prompt token.
3. **Sessions per GB of host memory**: N conversations through an engine whose session budget holds a few of them,
   with and without a disk tier bounded at ``--disk-ratio`` times that budget; then the conversations that still
   have their cache (in memory or on disk) are counted. Host memory is the session budget plus, with the
   disk tier, its index (measured with tracemalloc while a tier indexes the folder). Target >= 4x.

It ends with ``RESULT {json}``.

    .venv/bin/python -m bench.cache_tiers            # small model, 6 conversations
    .venv/bin/python -m bench.cache_tiers --quick    # tiny model, seconds
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

from bench.engine import bench_checkpoint
from bench.machine import machine_line
from bench.multiturn import QUESTIONS, noise_image
from bench.quick import add_quick_flag, parse_with_quick
from engine import EngineConfig, LLMEngine, greedy
from engine.kv.disk_tier import DiskTier
from engine.models.model_runner import ModelRunner


def turn(engine: LLMEngine, conv: str, history: list, content: list, new_tokens: int):
    """One request alone (its TTFT is pure prefill work); appends the question and its answer to ``history``."""
    history.append({"role": "user", "content": content})
    h = engine.add_request(history, greedy(new_tokens, ignore_eos=True), session_id=conv)
    while engine.has_work():
        engine.step()
    r = h.result(0)
    history.append({"role": "assistant", "content": [{"type": "text", "text": r.text}]})
    return r


def first_turns(engine: LLMEngine, convs: list[str], side: int, turns: int, new_tokens: int) -> dict:
    histories = {}
    for i, conv in enumerate(convs):
        histories[conv] = []
        for t in range(turns):
            content = [{"type": "text", "text": QUESTIONS[t % len(QUESTIONS)]}]
            if t == 0:
                content.insert(0, {"type": "image", "image": noise_image(i, side)})
            turn(engine, conv, histories[conv], content, new_tokens)
    return histories


def drop_page_cache(folder: Path) -> None:
    """Ask the kernel to forget the folder's cached pages, so the next reads come from the disk."""
    for path in folder.iterdir():
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def restart(runner, base: dict, args, folder: Path) -> dict:
    convs = [f"conv-{i}" for i in range(args.conversations)]
    first = LLMEngine(EngineConfig(**base, disk_cache_dir=str(folder)), runner=runner)
    histories = first_turns(first, convs, args.side, 2, args.new_tokens)
    first.stop()  # the worker's shutdown; what a crash loses instead is only what was still being written

    # cold reads, timed alone: the tier's own read of each conversation's file
    drop_page_cache(folder)
    tier = DiskTier(folder, 2**40, first.sessions.disk.identity)
    reads = []
    for conv in convs:
        start = time.perf_counter()
        fields = tier.get(conv)
        reads.append((time.perf_counter() - start, len(fields["token_ids"])))
    tier.close()

    drop_page_cache(folder)
    runner.image_features.__init__(0)  # a restarted worker has no image features either
    resumed = LLMEngine(EngineConfig(**base, disk_cache_dir=str(folder)), runner=runner)
    from_disk = {c: turn(resumed, c, list(histories[c]), [{"type": "text", "text": QUESTIONS[2]}], args.new_tokens)
                 for c in convs}
    resumed.stop()
    recompute = LLMEngine(EngineConfig(**base, session_cache=False), runner=runner)
    recomputed = {c: turn(recompute, c, list(histories[c]), [{"type": "text", "text": QUESTIONS[2]}],
                          args.new_tokens) for c in convs}
    runner.image_features.__init__(256 * 2**20)
    return dict(reads=reads, from_disk=from_disk, recomputed=recomputed)


def sessions_held(runner, base: dict, args, folder: Path | None, budget_mb: float) -> tuple[int, int]:
    """Of ``args.many`` conversations answered one after another, how many still have their cache (in memory or in
    the disk tier's files): read from the store, since a follow-up in that same order would evict the next one's."""
    disk = dict(disk_cache_dir=str(folder), disk_cache_mb=budget_mb * args.disk_ratio) if folder else {}
    engine = LLMEngine(EngineConfig(**base, session_budget_mb=budget_mb, session_group_share=1.0, **disk),
                       runner=runner)
    convs = [f"many-{i}" for i in range(args.many)]
    first_turns(engine, convs, args.side, 1, 4)
    held = set(engine.sessions.entries.keys())
    if folder:
        engine.sessions.disk.flush()
        held |= set(engine.sessions.disk.keys())
    engine.stop()
    return len(held & set(convs)), args.many


def entry_bytes(runner, base: dict, args) -> int:
    """Bytes of one conversation's entry after its first turn (what the sessions-per-GB table holds)."""
    engine = LLMEngine(EngineConfig(**base), runner=runner)
    first_turns(engine, ["one"], args.side, 1, 4)
    return engine.sessions.entries.get("one").nbytes


def index_bytes_per_file(folder: Path, identity) -> float:
    """Host memory a tier's index takes per file it finds (tracemalloc over opening the tier)."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    tier = DiskTier(folder, 2**40, identity)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    files = len(tier.keys())
    tier.close()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / max(files, 1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quick_flag(ap)
    ap.add_argument("--conversations", type=int, default=6, help="conversations restarted from disk")
    ap.add_argument("--many", type=int, default=24, help="conversations for the sessions-per-GB table")
    ap.add_argument("--held", type=float, default=3.0, help="sessions the host budget holds in that table")
    ap.add_argument("--disk-ratio", type=float, default=8.0, help="disk budget over host budget in that table")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--park-mode", default="int8", choices=("none", "int8", "int4"))
    ap.add_argument("--side", type=int, default=512, help="image side in pixels (~256 image tokens at 512)")
    ap.add_argument("--folder", type=Path, default=None,
                    help="where the disk tier's files go (default: a temporary folder under /tmp)")
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "bench-models",
                    help="where bench checkpoints are cached (shared with bench.engine)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's choice)")
    args = parse_with_quick(ap, argv, dict(conversations=2, many=6, side=128, new_tokens=4))
    if args.threads:
        torch.set_num_threads(args.threads)

    shape = "tiny" if args.quick else "small"
    ckpt = bench_checkpoint(shape, args.cache_dir, image_tokens=None if args.quick else (64, 256))
    base = dict(model=str(ckpt), dtype="auto", max_running=8, park_mode=args.park_mode)
    runner = ModelRunner(EngineConfig(**base))
    print(machine_line(str(runner.device), runner.dtype))
    print(f"model: {shape} LFM2-VL, {sum(p.numel() for p in runner.model.parameters()) / 1e6:.0f}M parameters; "
          f"sessions parked {args.park_mode}")
    warm = LLMEngine(EngineConfig(**base), runner=runner)  # first calls pay one-off allocator/kernel set-up
    first_turns(warm, ["warm"], args.side, 2, 4)

    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        root = Path(tmp)
        got = restart(runner, base, args, root / "restart")
        disk_ttft = [r.stats.ttft_s for r in got["from_disk"].values()]
        recompute_ttft = [r.stats.ttft_s for r in got["recomputed"].values()]
        sources = [r.stats.cache_source for r in got["from_disk"].values()]
        prompt_tokens = statistics.median(r.stats.prompt_tokens for r in got["recomputed"].values())
        agree = sum(a.token_ids == b.token_ids for a, b in zip(got["from_disk"].values(), got["recomputed"].values()))
        ttft_ratio = statistics.median(disk_ttft) / statistics.median(recompute_ttft)
        read_ms_per_token = 1e3 * statistics.median(s / n for s, n in got["reads"])
        prefill_ms_per_token = 1e3 * statistics.median(recompute_ttft) / prompt_tokens
        file_bytes = statistics.median(p.stat().st_size for p in (root / "restart").glob("*.kv"))
        print(f"\nfollow-up after a restart ({args.conversations} conversations, ~{prompt_tokens:.0f} prompt tokens, "
              f"files ~{file_bytes / 2**10:.0f} KiB, page cache dropped)")
        print(f"{'':>22} {'TTFT median':>12} {'ratio':>6}")
        print(f"{'served from disk':>22} {statistics.median(disk_ttft) * 1e3:>10.1f}ms {ttft_ratio:>6.2f}")
        print(f"{'recomputed':>22} {statistics.median(recompute_ttft) * 1e3:>10.1f}ms {1:>6.2f}")
        print(f"cache sources: {sources}; tokens equal to the recompute's: {agree}/{len(sources)} "
              f"({args.park_mode} K/V{'' if args.park_mode == 'none' else ': quantised, so not always'})")
        print(f"\nper token: disk read {read_ms_per_token:.4f} ms, recompute prefill {prefill_ms_per_token:.4f} ms, "
              f"ratio {read_ms_per_token / prefill_ms_per_token:.3f}")

        budget_mb = args.held * entry_bytes(runner, base, args) / 2**20
        without, total = sessions_held(runner, base, args, None, budget_mb)
        with_disk, _ = sessions_held(runner, base, args, root / "many", budget_mb)
        index_per_file = index_bytes_per_file(root / "many", _identity(root / "many"))
        host_without = budget_mb * 2**20
        host_with = host_without + index_per_file * (with_disk - min(with_disk, without))
        per_gb_without = without / (host_without / 2**30)
        per_gb_with = with_disk / (host_with / 2**30)
        held_ratio = per_gb_with / per_gb_without
        print(f"\nsessions per GB of host memory ({total} conversations, host session budget {budget_mb:.2f} MB "
              f"~{args.held:.0f} entries; disk tier {args.disk_ratio:.0f}x that; index {index_per_file:.0f} B a file)")
        print(f"{'':>14} {'held':>8} {'host MB':>8} {'per GB':>9} {'ratio':>6}")
        print(f"{'memory only':>14} {without:>8} {host_without / 2**20:>8.2f} {per_gb_without:>9.0f} {1:>6.2f}")
        print(f"{'with disk':>14} {with_disk:>8} {host_with / 2**20:>8.2f} {per_gb_with:>9.0f} {held_ratio:>6.2f}")

    result = dict(shape=shape, park_mode=args.park_mode, model_dtype=str(runner.dtype).replace("torch.", ""),
                  threads=torch.get_num_threads(), followup_ttft_ratio=round(ttft_ratio, 3),
                  disk_ttft_ms=round(statistics.median(disk_ttft) * 1e3, 2),
                  recompute_ttft_ms=round(statistics.median(recompute_ttft) * 1e3, 2),
                  served_from_disk=sources.count("disk"), conversations=len(sources), tokens_agree=agree,
                  read_ms_per_token=round(read_ms_per_token, 5), prefill_ms_per_token=round(prefill_ms_per_token, 5),
                  read_over_prefill_per_token=round(read_ms_per_token / prefill_ms_per_token, 4),
                  sessions_held_memory_only=without, sessions_held_with_disk=with_disk,
                  index_bytes_per_file=round(index_per_file), sessions_per_gb_ratio=round(held_ratio, 2),
                  targets_met=ttft_ratio <= 0.35 and held_ratio >= 4)
    print("RESULT " + json.dumps(result))
    return result


def _identity(folder: Path):
    """The identity the files in ``folder`` were written with (read from one header)."""
    from engine.kv import entry_file

    header = entry_file.read_header(str(next(folder.glob("*.kv"))))
    return entry_file.Identity(header["model"], header["dtype"], header["layout"])


if __name__ == "__main__":
    main()
