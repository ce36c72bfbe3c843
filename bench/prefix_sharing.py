"""Prefix sharing benchmark: a new conversation's example turn on a worker that holds its prefix, against one that
does not (engine/kv/prefix_index.py).

The example turn is what a page's example button sends: a system prompt, an example picture (about 256 image
tokens) and its question. Over the bench's "small" random-init LFM2-VL (about 100M parameters, auto dtype), one
request at a time (so TTFT is prefill work, not queueing), in one run:
- cold: a worker that never saw the picture (nothing cached but the weights); on a hybrid model its prompt pauses
  at its share points so they can be kept (one more forward each), which "cold, not shared" leaves out;
- features only: a worker that saw the picture but does not share prefixes (``shared_prefixes=False``): the
  vision features and the template head are cached, the rest is prefilled;
- warm, same question: another conversation asked the same example before: one token is prefilled;
- warm, other question: another conversation asked about the same picture: the picture is restored, the question
  prefilled.
Each is the median TTFT over ``--repeats`` new conversations (each a new client group); the table gives each way's
ratio to cold. It ends with ``RESULT {json}``; the target (docs/benchmarks.md) is warm_example_ttft_ratio <= 0.25.

    .venv/bin/python -m bench.prefix_sharing            # small model, 5 repeats
    .venv/bin/python -m bench.prefix_sharing --quick    # tiny model, seconds
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.engine import bench_checkpoint
from bench.machine import machine_line
from bench.multiturn import noise_image
from bench.quick import add_quick_flag, parse_with_quick
from engine import EngineConfig, LLMEngine, greedy
from engine.models.model_runner import ModelRunner

SYSTEM = "You are Owlet. Answer questions about the picture in one or two sentences."
EXAMPLE_QUESTION = "What is happening in this picture?"
OTHER_QUESTION = "Which colours stand out the most?"


def example(picture, question: str) -> list[dict]:
    return [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": question}]}]


def ask(engine: LLMEngine, messages, conv: str, new_tokens: int):
    handle = engine.add_request(messages, greedy(new_tokens, ignore_eos=True), session_id=conv, group=conv)
    while engine.has_work():
        engine.step()
    return handle.result(0)


def measure(runner, base: dict, way: str, picture, i: int, new_tokens: int) -> tuple[float, float]:
    """TTFT of new conversation ``i`` asked ``way`` on a worker of its own, and the share of its prompt restored."""
    runner.image_features.__init__(64 * 2**20)  # each way starts from its own worker state
    shared = way not in ("features only", "cold, not shared")
    engine = LLMEngine(EngineConfig(**base, shared_prefixes=shared), runner=runner)
    question = OTHER_QUESTION if way == "warm, other question" else EXAMPLE_QUESTION
    if not way.startswith("cold"):  # another conversation asked the example here before
        ask(engine, example(picture, EXAMPLE_QUESTION), f"earlier-{i}", new_tokens)
    result = ask(engine, example(picture, question), f"new-{i}", new_tokens)
    return result.stats.ttft_s, result.stats.cached_tokens / result.stats.prompt_tokens


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quick_flag(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "bench-models",
                    help="where bench checkpoints are cached (shared with bench.engine)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (0: torch's choice); 1 by default, as in bench.engine")
    args = parse_with_quick(ap, argv, dict(repeats=2))
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = "tiny" if args.quick else "small"
    side = 128 if args.quick else 512  # ~256 image tokens on the small shape (as bench.multiturn)
    ckpt = bench_checkpoint(shape, args.cache_dir, image_tokens=None if args.quick else (64, 256))
    base = dict(model=str(ckpt), dtype="auto", max_running=8)
    runner = ModelRunner(EngineConfig(**base))
    print(machine_line(str(runner.device), runner.dtype))
    print(f"model: {shape} LFM2-VL, {sum(p.numel() for p in runner.model.parameters()) / 1e6:.0f}M parameters")
    picture = noise_image(7, side)
    ways = ["cold", "cold, not shared", "features only", "warm, same question", "warm, other question"]
    for way in ways:  # one-off allocator and kernel set-up for every shape the ways run
        measure(runner, base, way, picture, -1, 2)
    runs: dict[str, list] = {way: [] for way in ways}
    for i in range(args.repeats):  # the ways take turns, so a change in the host's load meets them all
        for way in ways:
            runs[way].append(measure(runner, base, way, picture, i, args.new_tokens))
    figures = {way: ([t for t, _ in got], statistics.mean(r for _, r in got)) for way, got in runs.items()}
    cold = statistics.median(figures["cold"][0])
    prompt_len = len(LLMEngine(EngineConfig(**base), runner=runner).prompts.build(
        example(picture, EXAMPLE_QUESTION)).token_ids)
    print(f"\nexample turn TTFT (median of {args.repeats} new conversations; {prompt_len} prompt tokens)")
    print(f"{'way':>22} {'TTFT':>10} {'vs cold':>8} {'restored':>9}")
    ratios = {}
    for way in ways:
        ttft, reused = figures[way]
        ratios[way] = statistics.median(ttft) / cold
        print(f"{way:>22} {statistics.median(ttft) * 1e3:>8.1f}ms {ratios[way]:>8.2f} {reused:>9.0%}")
    result = dict(shape=shape, prompt_tokens=prompt_len, model_dtype=str(runner.dtype).replace("torch.", ""),
                  threads=torch.get_num_threads(), cold_ttft_ms=round(cold * 1e3, 2),
                  warm_example_ttft_ratio=round(ratios["warm, same question"], 3),
                  warm_other_question_ttft_ratio=round(ratios["warm, other question"], 3),
                  features_only_ttft_ratio=round(ratios["features only"], 3),
                  cold_not_shared_ttft_ratio=round(ratios["cold, not shared"], 3),
                  targets_met=ratios["warm, same question"] <= 0.25)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
