"""Multi-turn benchmark: what the session cache saves on follow-up turns, and what parking costs in bytes.

K conversations x T turns over the bench's "small" random-init LFM2-VL (about 100M parameters, auto dtype),
each conversation about its own image of about 256 image tokens. In one run it prints:
- TTFT per turn with the session cache vs forced recompute (no session cache, no image feature cache), and the
  ratio for turns >= 2;
- bytes per parked session in the model dtype vs int8 vs int4, and how many sessions a fixed budget holds;
- session and image cache hit rates.
It ends with ``RESULT {json}`` holding followup_ttft_ratio, int8_bytes_ratio and int4_bytes_ratio.

    .venv/bin/python -m bench.multiturn            # small model, 4 conversations x 3 turns
    .venv/bin/python -m bench.multiturn --quick    # tiny model, seconds (--tiny is the same flag)
    .venv/bin/python -m bench.multiturn --family mplug-owl3 [--owl-shape scaled|2b|tiny]
                                    [--owl-layout dynamic-gate|static-gate]

With ``--family mplug-owl3`` the model is a random-init mPLUG-Owl3 (hyper attention; each image is one
``<|image|>`` token plus 729 image K/V per hyper layer at 378 px) in the weight layout ``--owl-layout`` names
(engine/models/mplug_owl3/layout.py; ``dynamic-gate`` is 7B-240728's): the session entry then also holds the image's
cross-attention K/V, so a follow-up neither re-encodes nor re-projects the image. ``scaled`` keeps the 2B model's
head_dim, KV heads, hyper-layer spacing and 729 image tokens with fewer, narrower layers; ``2b`` is the full
mPLUG-Owl3-2B shape (about 8 GB in fp32: too slow for a shared CPU).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from PIL import Image

from bench.engine import bench_checkpoint
from bench.machine import machine_line
from bench.quick import add_quick_flag
from engine import EngineConfig, LLMEngine, greedy
from engine.models.model_runner import ModelRunner
from engine.models.mplug_owl3.layout import DYNAMIC_GATE, LAYOUTS

QUESTIONS = ["Describe the image.", "What colour is the largest shape?", "Where is it?", "How many shapes?",
             "Is there a red square?"]


def noise_image(seed: int, side: int) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (side, side, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def run_conversations(engine: LLMEngine, conversations: int, turns: int, side: int, new_tokens: int):
    """Turn by turn, conversation by conversation (one request at a time, so TTFT is pure prefill work)."""
    histories = {c: [] for c in range(conversations)}
    ttft = [[] for _ in range(turns)]
    cached = [[] for _ in range(turns)]
    for t in range(turns):
        for c in range(conversations):
            content = [{"type": "text", "text": QUESTIONS[t % len(QUESTIONS)]}]
            if t == 0:
                content.insert(0, {"type": "image", "image": noise_image(c, side)})
            histories[c].append({"role": "user", "content": content})
            h = engine.add_request(histories[c], greedy(new_tokens, ignore_eos=True), session_id=f"conv-{c}")
            while engine.has_work():
                engine.step()
            r = h.result(0)
            ttft[t].append(r.stats.ttft_s)
            cached[t].append(r.stats.cached_tokens / r.stats.prompt_tokens)
            histories[c].append({"role": "assistant", "content": [{"type": "text", "text": r.text}]})
    return ttft, cached, r.stats.prompt_tokens


# mPLUG-Owl3 shapes (config.json overrides of training/tiny_mplug_owl3.TINY_CONFIG).
_OWL_VISION_378 = dict(image_size=378, patch_size=14, layer_norm_eps=1e-6, model_type="siglip_vision_model")
OWL_SHAPES = {
    "tiny": {},
    "scaled": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=6,
                   num_key_value_heads=2, hyper_layers=[1, 5, 9],
                   vision_config=dict(_OWL_VISION_378, hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
                                      num_attention_heads=6)),
    "2b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
               num_key_value_heads=2, hyper_layers=[1, 9, 17, 25],
               vision_config=dict(_OWL_VISION_378, hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                  num_attention_heads=16)),
}


def owl_checkpoint(shape: str, layout: str, cache_dir: Path) -> Path:
    """A random-init mPLUG-Owl3 checkpoint of ``shape`` in weight layout ``layout``, built once and cached."""
    import hashlib
    import shutil
    import tempfile

    from training.tiny_mplug_owl3 import LAYOUT_CONFIG, build_tiny_mplug_owl3

    recipe = [shape, OWL_SHAPES[shape], layout, LAYOUT_CONFIG[layout]]
    key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:10]
    final = cache_dir / f"bench-mplug-owl3-{shape}-{layout}-{key}"
    if not (final / "config.json").exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".bench-owl-", dir=cache_dir))
        try:
            build_tiny_mplug_owl3(tmp, layout=layout, config_overrides=OWL_SHAPES[shape], init_std=0.02)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def parked_bytes(runner: ModelRunner, base: dict, side: int) -> dict[str, int]:
    """Bytes of one finished first turn held as a session entry, per parking mode."""
    out = {}
    for mode in ("none", "int8", "int4"):
        engine = LLMEngine(EngineConfig(**base, park_mode=mode), runner=runner)
        h = engine.add_request([{"role": "user", "content": [{"type": "image", "image": noise_image(99, side)},
                                                              {"type": "text", "text": QUESTIONS[0]}]}],
                               greedy(16, ignore_eos=True), session_id="measure")
        while engine.has_work():
            engine.step()
        h.result(0)
        entry = engine.sessions.entries.get("measure")
        out[mode] = entry.nbytes
        out[mode + "_kv"] = sum(k.nbytes + v.nbytes for k, v in entry.kv.values())
        out[mode + "_image_kv"] = sum(im.nbytes for im in getattr(entry, "images", []))  # mPLUG-Owl3 only
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quick_flag(ap, "--tiny")  # the tiny shape
    ap.add_argument("--family", choices=("lfm2-vl", "mplug-owl3"), default="lfm2-vl")
    ap.add_argument("--owl-shape", choices=tuple(OWL_SHAPES), default="scaled")
    ap.add_argument("--owl-layout", choices=tuple(LAYOUTS), default=DYNAMIC_GATE.name,
                    help="mPLUG-Owl3 weight layout (engine/models/mplug_owl3/layout.py)")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--budget-mb", type=float, default=64.0, help="fixed budget for the sessions-held table")
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "bench-models",
                    help="where bench checkpoints are cached (shared with bench.engine)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (0: torch's choice). 1 by default, as in bench.engine: on a shared "
                         "2-core machine two intra-op threads spin against other processes")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.family == "mplug-owl3":
        from engine.models.mplug_owl3 import load_runner

        shape = "tiny" if args.quick else args.owl_shape
        side = 512  # resized to the model's 378 (or tiny 56) px square: 729 (16) image K/V per hyper layer
        base = dict(model=str(owl_checkpoint(shape, args.owl_layout, args.cache_dir)), dtype="auto", max_running=8)
        runner = load_runner(EngineConfig(**base))
        name = f"{shape} mPLUG-Owl3, {runner.cfg.layout.name} layout (hyper layers {runner.hyper_layers})"
    else:
        shape = "tiny" if args.quick else "small"
        # ~256 image tokens: a 512 px square at patch 16 and 2x downsampling; the tiny shape caps at 16 tokens.
        side = 128 if args.quick else 512
        ckpt = bench_checkpoint(shape, args.cache_dir, image_tokens=(64, 256) if not args.quick else None)
        base = dict(model=str(ckpt), dtype="auto", max_running=8)
        runner = ModelRunner(EngineConfig(**base))
        name = f"{shape} LFM2-VL"
    print(machine_line(str(runner.device), runner.dtype))
    print(f"model: {name}, {sum(p.numel() for p in runner.model.parameters()) / 1e6:.0f}M parameters")

    warm = LLMEngine(EngineConfig(**base), runner=runner)  # first calls pay one-off allocator/kernel set-up
    run_conversations(warm, 1, 2, side, 4)
    runner.image_features.__init__(256 * 2**20)
    with_cache = LLMEngine(EngineConfig(**base), runner=runner)
    ttft_c, cached_c, prompt_len = run_conversations(with_cache, args.conversations, args.turns, side, args.new_tokens)
    stats = with_cache.stats()
    runner.image_features.__init__(0)  # forced recompute: no session reuse and no image feature reuse
    recompute = LLMEngine(EngineConfig(**base, session_cache=False), runner=runner)
    ttft_r, _, _ = run_conversations(recompute, args.conversations, args.turns, side, args.new_tokens)
    runner.image_features.__init__(256 * 2**20)

    print(f"\nTTFT per turn (median over {args.conversations} conversations; image ~{prompt_len} prompt tokens)")
    print(f"{'turn':>4} {'session cache':>14} {'recompute':>10} {'ratio':>6} {'reused prompt':>14}")
    for t in range(args.turns):
        a, b = statistics.median(ttft_c[t]), statistics.median(ttft_r[t])
        print(f"{t + 1:>4} {a * 1e3:>12.1f}ms {b * 1e3:>8.1f}ms {a / b:>6.2f} {statistics.mean(cached_c[t]):>13.0%}")
    follow_c = [x for t in ttft_c[1:] for x in t]
    follow_r = [x for t in ttft_r[1:] for x in t]
    followup_ratio = statistics.median(follow_c) / statistics.median(follow_r)

    sizes = parked_bytes(runner, base, side)
    bits = torch.finfo(runner.dtype).bits
    # Ratios are against the K/V in the model dtype; conv states stay full precision in every mode.
    int8_ratio, int4_ratio = sizes["int8_kv"] / sizes["none_kv"], sizes["int4_kv"] / sizes["none_kv"]
    budget = int(args.budget_mb * 2**20)
    print(f"\nbytes per parked session (one turn, ~{prompt_len} tokens; model dtype {runner.dtype}, {bits}-bit)")
    print(f"{'mode':>6} {'K/V bytes':>10} {'total':>10} {'vs dtype':>9} {'sessions in ' + str(args.budget_mb) + ' MB':>18}")
    for mode in ("none", "int8", "int4"):
        print(f"{mode:>6} {sizes[mode + '_kv']:>10} {sizes[mode]:>10} {sizes[mode + '_kv'] / sizes['none_kv']:>9.2f} "
              f"{budget // sizes[mode]:>18}")
    if sizes["none_image_kv"]:
        print(f"image cross-attention K/V in each entry: {sizes['none_image_kv']} B (none), "
              f"{sizes['int8_image_kv']} B (int8), {sizes['int4_image_kv']} B (int4)")

    hits = stats["session_hits"] + stats["session_partial_hits"]
    lookups = args.conversations * (args.turns - 1)  # follow-ups; first turns have nothing to hit
    ic = stats["image_cache"]
    print(f"\nsession cache: {hits}/{lookups} follow-ups hit ({stats['session_partial_hits']} partial), "
          f"{stats['reused_tokens']} prompt tokens reused; image feature cache: {ic['hits']} hits, "
          f"{ic['misses']} misses; template prefix hits: {stats['prefix_hits']}")
    layout = runner.cfg.layout.name if args.family == "mplug-owl3" else None
    result = dict(family=args.family, shape=shape, layout=layout, followup_ttft_ratio=round(followup_ratio, 3),
                  int8_bytes_ratio=round(int8_ratio, 3), int4_bytes_ratio=round(int4_ratio, 3),
                  model_dtype=str(runner.dtype).replace("torch.", ""), session_hit_rate=round(hits / max(lookups, 1), 3),
                  targets_met=followup_ratio <= 0.25 and int8_ratio <= 0.53 and int4_ratio <= 0.30)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
