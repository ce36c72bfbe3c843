"""Varlen against padded decode attention, side by side: one batch of rows with very different context lengths.

    python -m bench.varlen [--rows 16] [--shortest 64] [--longest 2000] [--steps 20] [--dtype float32] [--quick]

Both ways serve the same ``--rows`` text requests (contexts spread evenly from ``--shortest`` to ``--longest``
prompt tokens, in a shuffled row order, as arrivals leave them) on the "small" bench checkpoint (``--quick``: the
tiny one, 4 rows of 16..640 tokens), one torch thread. After the batch is full and warm, ``--steps`` decode steps
are timed per way, alternating the two ways twice. Printed: ms per step, the share of attended K/V positions that
were padding, and whether the tokens agree. Ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from bench.engine import bench_checkpoint
from bench.machine import machine_line
from bench.quick import add_quick_flag, parse_with_quick
from bench.step_profile import _long_prompt


def _engine(ckpt, args, mode: str):
    from engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig(model=str(ckpt), dtype=args.dtype, max_running=args.rows, default_deadline_s=None,
                                  max_prefill_tokens=4096, kv_pool_mb=2048, decode_attention=mode))


def fill(engine, prompts, budget: int):
    from engine import SamplingParams

    handles = [engine.add_request(p, SamplingParams(max_new_tokens=budget, temperature=0.0, ignore_eos=True))
               for p in prompts]
    while len(engine.batch) < len(prompts):
        engine.step()
    for _ in range(2):
        engine.step()
    return handles


def timed_steps(engine, steps: int) -> tuple[float, float]:
    """Seconds per decode step, and the padding share of the attended positions, over ``steps`` steps."""
    attended = needed = 0
    start = time.perf_counter()
    for _ in range(steps):
        batch = engine.batch
        needed += int(batch.seq_lens.sum()) + len(batch)
        engine.step()
        attended += batch.last_attended
    return (time.perf_counter() - start) / steps, 1 - needed / max(1, attended)


QUICK = dict(shape="tiny", rows=4, shortest=16, longest=640, steps=4)  # long enough for a cut to pay


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--shape", choices=("small", "tiny"), default="small", help="bench checkpoint (bench.engine)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--shortest", type=int, default=64)
    ap.add_argument("--longest", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    args = parse_with_quick(ap, argv, QUICK)
    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parents[1]
    ckpt = bench_checkpoint(args.shape, root / ".cache" / "bench-models")
    engines = {mode: _engine(ckpt, args, mode) for mode in ("padded", "varlen")}
    lengths = [round(args.shortest + i * (args.longest - args.shortest) / max(1, args.rows - 1))
               for i in range(args.rows)]
    random.Random(0).shuffle(lengths)
    prompts = [_long_prompt(engines["padded"], n, i) for i, n in enumerate(lengths)]
    budget = 2 * args.steps + 8
    handles = {mode: fill(engine, prompts, budget) for mode, engine in engines.items()}
    times = {mode: [] for mode in engines}
    padding = {}
    for _ in range(2):  # alternate the ways, keep each one's best
        for mode, engine in engines.items():
            seconds, padding[mode] = timed_steps(engine, args.steps // 2)
            times[mode].append(seconds)
    for engine in engines.values():
        while engine.has_work():
            engine.step()
    agree = all(a.result(0).token_ids == b.result(0).token_ids for a, b in zip(handles["padded"], handles["varlen"]))
    best = {mode: min(t) for mode, t in times.items()}
    print(machine_line("cpu", getattr(torch, args.dtype)))
    print(f"{args.rows} rows, prompts {args.shortest}..{args.longest} tokens (shuffled), {args.steps} decode steps "
          f"per way, alternated\n")
    print(f"{'way':<10}{'ms/step':>10}{'padding attended':>18}{'varlen x':>10}")
    for mode in ("padded", "varlen"):
        print(f"{mode:<10}{1000 * best[mode]:>10.1f}{100 * padding[mode]:>17.0f}%"
              f"{best[mode] / best['varlen']:>9.2f}x")
    print(f"tokens agree: {agree}")
    result = {"shape": args.shape, "rows": args.rows, "dtype": args.dtype,
              "padded_ms": round(1000 * best["padded"], 1), "varlen_ms": round(1000 * best["varlen"], 1),
              "speedup": round(best["padded"] / best["varlen"], 2),
              "padded_padding_pct": round(100 * padding["padded"], 1),
              "varlen_padding_pct": round(100 * padding["varlen"], 1), "tokens_agree": agree}
    for engine in engines.values():
        engine.stop()
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
