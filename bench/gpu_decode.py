"""GPU decode benchmark (run by ``bench/gpu.sh``): the LFM2-VL-1.6B text shape in fp16 on one CUDA device.

Measures, for ``decode_graphs`` off, cuda (captured) and cuda-compiled (captured, the step's forward through
``torch.compile``: ``EngineConfig.decode_compile``), or the modes ``--graphs`` names:
- decode tokens/s with a full batch of 1, 16 and 64 rows (``--batches``), timed over ``--steps`` engine steps after
  the batch is prefilled and warmed up (graph capture happens in the warm-up);
- B=1 decode rate ÷ the bandwidth limit, the limit being measured copy bandwidth ÷ the weights' bytes (every
  decode step must read every weight once);
- TTFT of a first turn with an image, and of the follow-up turn in the same session (session cache on);
- whether the captured (and the compiled) step gives the same greedy tokens as the eager one, row by row.

Prints a table and ``RESULT {json}``. ``--quick`` runs the tiny model on the CPU (graphs off and static, B=1 and 4,
a few steps) in seconds, to check the benchmark runs; ``--tiny`` is the same flag.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch


def copy_bandwidth(device: str, gib: float) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        b.copy_(a)
    sync()
    return 2 * a.nbytes * reps / (time.perf_counter() - t)


def _prompt(words: int, seed: int, image=None):
    import random

    from bench.engine import _WORDS
    rng = random.Random(seed)
    content = [{"type": "text", "text": " ".join(rng.choice(_WORDS) for _ in range(words)) + "?"}]
    if image is not None:
        content.insert(0, {"type": "image", "image": image})
    return [{"role": "user", "content": content}]


def _fill(engine, handles, rows: int) -> None:
    """Step until ``rows`` requests decode together; stop with the first failure instead of looping forever (a
    prefill that fails ends its request, so the batch would never fill)."""
    for _ in range(100 * rows + 100):
        if len(engine.batch) >= rows:
            return
        failed = [h.result(0).error for h in handles if h.finished and h.result(0).error]
        if failed:
            raise SystemExit(f"gpu_decode: a request failed before the batch filled: {failed[0]}")
        engine.step()
    raise SystemExit(f"gpu_decode: {rows} rows never decoded together (batch holds {len(engine.batch)})")


def decode_rate(engine, rows: int, steps: int, sync) -> tuple[float, list[list[int]]]:
    from engine import SamplingParams

    handles = [engine.add_request(_prompt(200, i), SamplingParams(max_new_tokens=steps + 12, temperature=0.0,
                                                                  ignore_eos=True)) for i in range(rows)]
    _fill(engine, handles, rows)
    for _ in range(4):  # warm-up (and graph capture for this shape)
        engine.step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    rate = rows * steps / (time.perf_counter() - t)
    while engine.has_work():
        engine.step()
    return rate, [list(h.result(0).token_ids) for h in handles]


def trace_steps(engine, rows: int, steps: int, device: str) -> None:
    """Print where ``steps`` eager decode steps of ``rows`` rows spend their time (torch.profiler, top ops)."""
    from torch.profiler import ProfilerActivity, profile

    from engine import SamplingParams
    handles = [engine.add_request(_prompt(200, 1000 + i), SamplingParams(max_new_tokens=steps + 8, temperature=0.0,
                                                                         ignore_eos=True)) for i in range(rows)]
    _fill(engine, handles, rows)
    engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=60), flush=True)
    while engine.has_work():
        engine.step()
    assert all(h.result(0).error is None for h in handles)


def ttft_pair(engine) -> tuple[float, float]:
    import numpy as np
    from PIL import Image

    from engine import SamplingParams
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (384, 384, 3), dtype=np.uint8))
    first = _prompt(40, 99, img)
    h = engine.add_request(first, SamplingParams(max_new_tokens=16, temperature=0.0), session_id="gpu-bench")
    while engine.has_work():
        engine.step()
    r1 = h.result(0)
    follow = first + [{"role": "assistant", "content": [{"type": "text", "text": r1.text}]},
                      {"role": "user", "content": [{"type": "text", "text": "and what else?"}]}]
    h = engine.add_request(follow, SamplingParams(max_new_tokens=4, temperature=0.0), session_id="gpu-bench")
    while engine.has_work():
        engine.step()
    return r1.stats.ttft_s, h.result(0).stats.ttft_s


# --quick (and --tiny): the tiny model on the CPU, eager and static-shape steps, B=1 and 4, a small bandwidth copy.
QUICK = dict(device="cpu", batches="1,4", steps=8, graphs="off,static", bandwidth_gib=0.0625)


def main(argv=None) -> dict:
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench.engine import bench_checkpoint
    from bench.machine import machine_line
    from bench.quick import add_quick_flag, parse_with_quick
    from engine import EngineConfig, LLMEngine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick_flag(p, "--tiny")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--graphs", default="off,cuda,cuda-compiled",
                   help="decode_graphs settings to compare; 'cuda-shapefree' is 'cuda' with the eager steps' "
                        "attention kernels (cuDNN left out); '<mode>-compiled' is <mode> with decode_compile (the "
                        "step's forward through torch.compile, captured in the graph with 'cuda')")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--trace", type=int, default=0, metavar="ROWS",
                   help="also profile 8 decode steps of ROWS rows in the first --graphs mode and print the top ops")
    p.add_argument("--bandwidth-gib", type=float, default=1.0, help="size of the copy that measures bandwidth")
    args = parse_with_quick(p, argv, QUICK)
    shape = "tiny" if args.quick else "lfm2-vl-1.6b"
    dtype = "float16" if args.device.startswith("cuda") else "float32"
    t0 = time.perf_counter()
    ckpt = bench_checkpoint(shape, Path(args.cache_dir) if args.cache_dir else root / ".cache" / "bench-models")
    print(f"checkpoint {shape} ready in {time.perf_counter() - t0:.0f}s", flush=True)
    print(machine_line(args.device, getattr(torch, dtype)))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    batches = [int(b) for b in args.batches.split(",")]
    bandwidth = copy_bandwidth(args.device, args.bandwidth_gib)
    result: dict = {"shape": shape, "device": args.device, "dtype": dtype,
                    "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1)}
    tokens: dict[str, dict[int, list]] = {}
    runner = None
    for graphs in [g for g in args.graphs.split(",") if g]:
        config = EngineConfig(model=str(ckpt), dtype=dtype, device=args.device, max_running=max(batches),
                              decode_graphs=graphs.split("-")[0], decode_compile=graphs.endswith("-compiled"),
                              default_deadline_s=None)
        engine = LLMEngine(config, runner=runner)
        if graphs.endswith("-shapefree"):  # the captured step with the eager steps' kernels (no cuDNN attention)
            from engine.models.model_runner import SHAPE_FREE_SDPA
            engine.batch.static_step.attention_backends = SHAPE_FREE_SDPA
        runner = engine.runner  # load the weights once
        weights = runner.weight_bytes
        tokens[graphs] = {}
        try:
            if args.trace and len(tokens) == 1:
                trace_steps(engine, args.trace, 8, args.device)
            for rows in batches:
                if graphs.endswith("-compiled"):  # compile every shape this run meets before timing it
                    decode_rate(engine, rows, args.steps, sync)
                rate, toks = decode_rate(engine, rows, args.steps, sync)
                tokens[graphs][rows] = toks
                result[f"decode_tok_s_b{rows}_graphs_{graphs}"] = round(rate, 1)
                print(f"  graphs={graphs:14} B={rows:3}: {rate:9.1f} tok/s", flush=True)
            ttft, follow = ttft_pair(engine)
            result[f"ttft_s_graphs_{graphs}"] = round(ttft, 4)
            result[f"followup_ttft_s_graphs_{graphs}"] = round(follow, 4)
            print(f"  graphs={graphs:14} TTFT {ttft * 1000:.1f} ms, follow-up TTFT {follow * 1000:.1f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001 — keep the other mode's figures; say what broke
            result[f"error_graphs_{graphs}"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  graphs={graphs} FAILED: {type(exc).__name__}: {exc}", flush=True)
        engine.stop()
    # B=1 reads every weight once per token; the text decoder's weights are what decode reads (not the vision tower)
    text_bytes = sum(p.numel() * p.element_size() for n, p in runner.model.named_parameters()
                     if "vision" not in n and "multi_modal_projector" not in n)
    limit = bandwidth / text_bytes
    result["text_weight_gb"] = round(text_bytes / 1e9, 3)
    result["all_weight_gb"] = round(weights / 1e9, 3)
    result["b1_bandwidth_limit_tok_s"] = round(limit, 1)
    for graphs in tokens:
        if 1 in tokens[graphs] and f"decode_tok_s_b1_graphs_{graphs}" in result:
            result[f"b1_of_limit_graphs_{graphs}"] = round(result[f"decode_tok_s_b1_graphs_{graphs}"] / limit, 3)
    # Token agreement between modes: the static eager step and its captured replay run the same kernels on the same
    # shapes, so they must agree exactly; "off" runs other shapes (unpadded rows, exact spans), and in fp16 a
    # random-init model's near-ties can flip there, so its agreement is reported as a share.
    modes = list(tokens)
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            pairs = [(x, y) for r in batches if r in tokens[a] and r in tokens[b]
                     for x, y in zip(tokens[a][r], tokens[b][r])]
            if pairs:
                same_rows = sum(x == y for x, y in pairs)
                prefix = sum(next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), len(x)) for x, y in pairs)
                result[f"rows_equal_{a}_vs_{b}"] = f"{same_rows}/{len(pairs)}"
                result[f"tokens_before_divergence_{a}_vs_{b}"] = round(prefix / sum(len(x) for x, _ in pairs), 3)
                print(f"tokens {a} vs {b}: {same_rows}/{len(pairs)} rows identical, "
                      f"{prefix / sum(len(x) for x, _ in pairs):.1%} of tokens before the first divergence")
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; text weights {text_bytes / 1e9:.2f} GB -> B=1 limit "
          f"{limit:.0f} tok/s")
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
