"""Batched against one-at-a-time prefill, side by side: a burst of new image conversations arriving at once.

    python -m bench.prefill_burst [--turns 64] [--prefill-budget 4096] [--shape small] [--quick]

(``python -m bench.engine`` runs it too, after its workload, with its own shape, dtype and threads.)

A shared link going round sends many new image turns at the same moment. Each turn has a unique image and a short
question (4..40 words) and asks for a short answer (``--answer`` tokens), so time to first token is what it
measures. Two engines serve the same burst, with ``max_running`` = the burst and the same prefill budget per step:

- ``alone``: ``batched_prefill=off``, one prefill forward per prompt;
- ``batched``: ``batched_prefill=on``: the prompts a step admits go through the model together
  (engine/batch/prefill_batch.py).

Each way runs ``--repeats`` times, alternated, and keeps its best run by TTFT p95. Printed per way: prefill
forwards of the text model per burst, vision tower forwards (one per image alone; one per pixel layout batched),
TTFT p50 and p95 from arrival, the makespan, and whether the two ways' tokens agree. Ends with ``RESULT {json}`` when run alone.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from bench.engine import SHAPES, BenchRequest, bench_checkpoint, run_engine
from bench.machine import machine_line
from bench.quick import add_quick_flag, parse_with_quick

_WORDS = "what colour is the circle where is the red square how many shapes are there describe the image".split()


def image_burst(n: int, image_sides: tuple[int, ...], answer: int, seed: int = 7) -> list[BenchRequest]:
    """``n`` new conversations, each one image (unique noise) and a 4..40 word question."""
    import numpy as np
    from PIL import Image

    rng, pixels = random.Random(seed), np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = rng.choice(image_sides), rng.choice(image_sides)
        picture = Image.fromarray(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8))
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 40))) + "?"
        messages = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": text}]}]
        out.append(BenchRequest(i, messages, answer, True))
    return out


def _engine(ckpt: Path, dtype: torch.dtype, device: str, turns: int, budget: int, batched: bool):
    from engine import EngineConfig, LLMEngine

    config = EngineConfig(model=str(ckpt), dtype=str(dtype).replace("torch.", ""), device=device,
                          max_running=turns, max_prefill_tokens=budget, batched_prefill="on" if batched else "off",
                          session_cache=False, default_deadline_s=None, time_slice_tokens=0)
    return LLMEngine(config).start()


def compare(ckpt: Path, dtype: torch.dtype, device: str, image_sides, turns: int, budget: int, answer: int,
            repeats: int) -> dict:
    """Serve one burst both ways, alternated ``repeats`` times; print the table; the headline figures."""
    requests = image_burst(turns, image_sides, answer)
    ways = {"alone": False, "batched": True}
    engines = {way: _engine(ckpt, dtype, device, turns, budget, on) for way, on in ways.items()}
    best, forwards, vision = {}, {}, {}
    try:
        warm = image_burst(2, image_sides, 2, seed=99)
        for engine in engines.values():  # first calls pay one-off costs (allocator, kernels, vision tower)
            run_engine(engine, warm, [0.0] * len(warm), "warmup")
        for _ in range(repeats):
            for way, engine in engines.items():
                before, vision_before = engine.stats()["prefill_forwards"], engine.runner.vision_forwards
                engine.runner.image_features.__init__(engine.runner.image_features.budget)  # every repeat encodes
                result = run_engine(engine, requests, [0.0] * turns, "burst", way)
                if way not in best or result.ttft_percentile(0.95) < best[way].ttft_percentile(0.95):
                    best[way] = result
                forwards[way] = engine.stats()["prefill_forwards"] - before  # the same every run
                vision[way] = engine.runner.vision_forwards - vision_before
        prompt_tokens = [len(engines["alone"].prompts.build(r.messages).token_ids) for r in requests]
    finally:
        for engine in engines.values():
            engine.stop()
    tokens = {way: {o.index: o.token_ids for o in r.outcomes} for way, r in best.items()}
    agree = tokens["alone"] == tokens["batched"]
    print(f"\nburst of {turns} image turns at once: prompts {min(prompt_tokens)}..{max(prompt_tokens)} tokens, "
          f"{answer}-token answers, max_running {turns}, prefill budget {budget} tokens per step, best of {repeats}")
    print(f"{'prefill':10}{'forwards':>9}{'vision':>8}{'TTFT p50':>10}{'TTFT p95':>10}{'makespan':>10}")
    for way, r in best.items():
        print(f"{way:10}{forwards[way]:>9}{vision[way]:>8}{r.ttft_percentile(0.5):>9.2f}s"
              f"{r.ttft_percentile(0.95):>9.2f}s{r.makespan_s:>9.2f}s")
    a, b = best["alone"], best["batched"]
    p50 = a.ttft_percentile(0.5) / b.ttft_percentile(0.5)
    p95 = a.ttft_percentile(0.95) / b.ttft_percentile(0.95)
    print(f"batched: {forwards['alone'] / max(1, forwards['batched']):.1f}x fewer prefill forwards; TTFT p50 "
          f"{p50:.2f}x and p95 {p95:.2f}x lower than one at a time; tokens agree: {agree}")
    return {"burst_turns": turns, "burst_prefill_budget": budget,
            "burst_prefill_forwards_alone": forwards["alone"], "burst_prefill_forwards_batched": forwards["batched"],
            "burst_vision_forwards_alone": vision["alone"], "burst_vision_forwards_batched": vision["batched"],
            "burst_ttft_p50_s_alone": round(a.ttft_percentile(0.5), 3),
            "burst_ttft_p95_s_alone": round(a.ttft_percentile(0.95), 3),
            "burst_ttft_p50_s_batched": round(b.ttft_percentile(0.5), 3),
            "burst_ttft_p95_s_batched": round(b.ttft_percentile(0.95), 3),
            "burst_ttft_p50_alone_over_batched": round(p50, 2), "burst_ttft_p95_alone_over_batched": round(p95, 2),
            "burst_tokens_agree": agree}


QUICK = dict(shape="tiny", turns=16, repeats=1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--shape", choices=("small", "tiny", "lfm2-vl-1.6b"), default="small",
                    help="bench checkpoint (bench.engine)")
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--prefill-budget", type=int, default=4096, help="max_prefill_tokens of both engines")
    ap.add_argument("--answer", type=int, default=8, help="tokens per answer")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=1)
    args = parse_with_quick(ap, argv, QUICK)
    from engine.models.model_runner import resolve_dtype

    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, torch.device(args.device))
    root = Path(__file__).resolve().parents[1]
    ckpt = bench_checkpoint(args.shape, root / ".cache" / "bench-models")
    print(machine_line(args.device, dtype))
    result = {"shape": args.shape, "dtype": str(dtype).replace("torch.", ""),
              **compare(ckpt, dtype, args.device, SHAPES[args.shape]["image_sides"], args.turns,
                        args.prefill_budget, args.answer, args.repeats)}
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
