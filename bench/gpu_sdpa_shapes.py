"""What one decode-shaped SDPA call costs on CUDA the first time a shape is seen, and again.

A decode step attends ``[B, heads, 1, T]`` queries over T cached positions with a boolean mask, and T grows by one
every step, so an eager decode meets a new shape every step. A kernel that builds a plan per shape (cuDNN
attention) pays that build every step; the engine's choice (``engine.models.model_runner.SHAPE_FREE_SDPA``) should not.
Prints a table and ``RESULT {json}``: median ms of a call on a new T and on a T already seen, per kernel choice.
Usage: python -m bench.gpu_sdpa_shapes [--device cuda] [--quick]

``--quick`` times 2 rows over 4 new shapes per choice, on the CPU when no CUDA device is present (the plan cost it
looks for exists only on CUDA, so there it checks the benchmark runs and measures nothing).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.quick import add_quick_flag, parse_with_quick
from engine.models.model_runner import SHAPE_FREE_SDPA

CHOICES = {"torch default": None, "engine (no cuDNN)": SHAPE_FREE_SDPA, "cuDNN only": [SDPBackend.CUDNN_ATTENTION]}


def call_ms(fn, sync) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1000


def measure(backends, device: str, rows: int, t0: int, n: int, dtype) -> tuple[float, float]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)
    first, again = [], []
    for t in range(t0, t0 + n):
        q = torch.randn(rows, 32, 1, 64, device=device, dtype=dtype, generator=g)
        k = torch.randn(rows, 32, t, 64, device=device, dtype=dtype, generator=g)
        v = torch.randn_like(k)
        mask = torch.ones(rows, 1, 1, t, dtype=torch.bool, device=device)
        mask[0, ..., t // 2:] = False  # one shorter row, as in a mixed batch

        def run():
            if backends is None:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            with sdpa_kernel(backends):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        first.append(call_ms(run, sync))
        again.append(min(call_ms(run, sync) for _ in range(3)))
    return statistics.median(first), statistics.median(again)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick_flag(p)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--shapes", type=int, default=24, help="new T values per kernel choice")
    args = parse_with_quick(p, argv, dict(rows=2, shapes=4))
    if args.quick and args.device.startswith("cuda") and not torch.cuda.is_available():
        print("note: no CUDA device, so this quick run times SDPA on the CPU: it checks that the benchmark runs; "
              "the per-shape plan cost it measures exists only on CUDA")
        args.device = "cpu"
    dtype = torch.float16 if args.device.startswith("cuda") else torch.float32
    result = {"device": args.device, "rows": args.rows}
    print(f"{'kernels':20} {'new T, ms':>10} {'seen T, ms':>11}")
    for i, (name, backends) in enumerate(CHOICES.items()):
        try:
            first, again = measure(backends, args.device, args.rows, 300 + 50 * i, args.shapes, dtype)
        except RuntimeError as exc:  # e.g. cuDNN attention not available for this build or mask
            print(f"{name:20} unavailable: {str(exc).splitlines()[0][:80]}")
            continue
        print(f"{name:20} {first:10.3f} {again:11.3f}")
        key = name.split()[0].lower()
        result[f"{key}_new_shape_ms"], result[f"{key}_seen_shape_ms"] = round(first, 3), round(again, 3)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
