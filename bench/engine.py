"""Engine benchmark: one mixed VLM workload served three ways in a single run, side by side.

Workload: 32 requests with mixed prompt lengths, half with an image (each image unique, so no image
cache helps), ``max_new_tokens`` spread over 8..128, arriving all at once ("burst") and then as a
Poisson stream. Ways:

1. ``sequential``: one ``model.generate()`` per request, in arrival order;
2. ``static``: ``generate()`` over left-padded batches of up to ``max_running`` requests. A batch
   runs until its longest request is done; on the Poisson stream a batch is whatever has arrived
   (at least one request) when the previous batch ends;
3. ``engine``: Owlet's continuous-batching ``LLMEngine`` with the same ``max_running``;
4. ``engine-unpacked`` (only when named in ``--ways``): the same engine with ``cpu_kernels=off`` (every matmul
   through the model's own ``nn.Linear``), so the share of the lead that the CPU kernels (engine/models/cpu/) bring is
   measured in the same run; ``engine-cpu-<kernels>`` (e.g. ``engine-cpu-onednn``, ``engine-cpu-packed+panel``):
   the engine on those kernels alone (``cpu_kernels=onednn``, ``packed,panel``), so each kernel's worth is
   measured side by side.

Fairness: every way loads the same checkpoint in the same dtype, decodes greedily, and produces
exactly ``max_new_tokens`` tokens per request (checked and printed). Random weights would emit EOS
at random, so the bench checkpoint has the EOS rows of its (tied) embedding zeroed: the EOS logit
is then exactly 0 while the other ~500 logits are random, so greedy decoding never picks it. As a
backstop generate() gets ``min_new_tokens`` and the engine ``ignore_eos``.

Measures. tokens/s and requests/s count requested tokens and requests over the makespan (first
arrival to last token). TTFT is from a request's arrival, queueing included, to its first token:
for ``generate()`` a streamer stamps each decoding step (the first stamp after the prompt is the
first token of every row of that batch); for the engine it is ``stats.ttft_s`` (``add_request``
to first token) plus the submitter's lag behind the scheduled arrival.

Both generate() and the engine run in this one process with the same torch thread count (1 by
default on CPU, see ``--threads``). On the burst, static and engine run twice, alternated, and each
keeps its best run (``--burst-repeats``); sequential runs once, as it lasts minutes (which averages
out load swings) and sits far from its target. The table's ``steps`` (decode forward passes) and
``useful`` (share of computed rows a request needed) columns count work and carry no timing noise.
The Poisson rate defaults to 0.7x the engine's burst requests/s, a load the engine keeps up with.

Batched prefill: after the workload, a burst of ``--burst-turns`` (64) new image turns arriving at once is served
with prefill one prompt at a time and batched (engine/batch/prefill_batch.py), side by side: prefill forwards per burst
and TTFT p50/p95 (bench/prefill_burst.py; ``--no-prefill-burst`` skips it).

Run: ``python -m bench.engine`` (the "small" 87M-parameter shape, 8-10 minutes on 2 shared CPU cores),
``--quick`` (the tiny shape and short budgets: seconds; ``--tiny`` is the same flag), ``--shape lfm2-vl-1.6b``
(real LFM2-VL-1.6B text shape, random init; meant for a GPU, fp16). ``--profile`` (with ``--quick`` too) runs
``bench.step_profile`` instead of the workload. The last line is ``RESULT {json}`` with the headline ratios.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.machine import machine_line
from bench.quick import add_quick_flag, parse_with_quick

# Text / vision / processor shapes. "small" has 87M parameters; "lfm2-vl-1.6b" follows the
# real model's text shape (hidden 2048, 16 layers, attention at 2, 5, 8, 10, 12, 14, 8 KV heads
# of dim 64) and a SigLIP2-so400m-like vision tower. Vocabularies stay at the local tokenizer's
# size (~500), since no 65k-token tokenizer exists offline; that understates the LM head's cost
# (the 1.6b shape has 1.48B parameters here: text 1.05B + vision 0.43B; the real vocabulary adds 0.13B).
SHAPES = {
    "tiny": dict(text={}, vision={}, projector=64, image_tokens=(4, 16), image_sides=(64, 96, 128)),
    "small": dict(
        text=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, initializer_range=0.02),
        vision=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4),
        projector=512, image_tokens=(16, 64), image_sides=(128, 192, 256, 320)),
    "lfm2-vl-1.6b": dict(
        text=dict(hidden_size=2048, intermediate_size=12288, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, initializer_range=0.02, max_position_embeddings=8192,
                  layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]),
        vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16),
        projector=2048, image_tokens=(64, 256), image_sides=(256, 384, 512), save_dtype="float16"),
}
_CHECKPOINT_VERSION = 1  # bump when the checkpoint recipe changes
_WORDS = ("what colour is the circle where is the red square how many shapes are there describe the image "
          "a small blue star and a large green square on a striped background the triangle is on the left").split()


@dataclass
class BenchRequest:
    index: int
    messages: list
    max_new_tokens: int
    has_image: bool
    prompt_tokens: int = 0


@dataclass
class Outcome:
    """What one way measured for one request; times are seconds from the run's start."""
    index: int  # BenchRequest.index
    arrival_s: float
    first_token_s: float
    last_token_s: float
    generated_tokens: int
    token_ids: tuple[int, ...] = ()  # what this way generated for the request (compared across ways)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclass
class WayResult:
    way: str
    pattern: str
    outcomes: list[Outcome] = field(default_factory=list)
    # Model work, free of timing noise: batched decode forward passes, and the rows they computed
    # (a static batch keeps computing rows whose request already has its tokens).
    decode_steps: int = 0
    decode_rows: int = 0
    prefill_rows: int = 0  # prompt token rows the prefill forwards computed (a static batch pads to its longest)
    # Engine only: the "batch of one" tail — decode steps that ran a single row, and their
    # wall time (the end of a burst, when the last long answers run alone).
    single_row_steps: int = 0
    single_row_s: float = 0.0
    padding_share: float = 0.0  # share of the K/V positions decode attention spanned that were padding
    # Engine only: wall time inside the model's prefill (vision included) and decode forwards.
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def makespan_s(self) -> float:
        return max(o.last_token_s for o in self.outcomes) - min(o.arrival_s for o in self.outcomes)

    @property
    def tokens_per_s(self) -> float:
        return sum(o.generated_tokens for o in self.outcomes) / self.makespan_s

    @property
    def requests_per_s(self) -> float:
        return len(self.outcomes) / self.makespan_s

    def ttft_percentile(self, q: float) -> float:
        values = sorted(o.ttft_s for o in self.outcomes)
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# ----------------------------------------------------------------------------- checkpoint


def bench_checkpoint(shape: str, cache_dir: Path, image_tokens: tuple[int, int] | None = None) -> Path:
    """Build (once, cached) a random-init LFM2-VL checkpoint of ``shape`` whose EOS is never greedy.

    ``image_tokens`` overrides the shape's (min, max) image tokens (the multi-turn bench wants ~256)."""
    from training.tiny_checkpoint import build_lfm2vl_checkpoint, make_lfm2vl_processor, silence_eos, train_tokenizer

    spec = dict(SHAPES[shape], **({"image_tokens": tuple(image_tokens)} if image_tokens else {}))
    key = hashlib.sha256(json.dumps([shape, _CHECKPOINT_VERSION, repr(spec)]).encode()).hexdigest()[:10]
    final = cache_dir / f"bench-lfm2vl-{shape}-{key}"
    if (final / "config.json").exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bench-", dir=cache_dir))
    try:
        tokenizer = train_tokenizer()
        lo, hi = spec["image_tokens"]
        processor = make_lfm2vl_processor(tokenizer, max_image_tokens=hi, min_image_tokens=lo)
        build_lfm2vl_checkpoint(tmp, tokenizer=tokenizer, processor=processor, text_overrides=spec["text"],
                                vision_overrides=spec["vision"], projector_hidden_size=spec["projector"],
                                dtype=spec.get("save_dtype", "float32"))  # 1.5B params: fp16 halves the disk
        silence_eos(tmp, tokenizer.eos_token_id)
        try:
            tmp.rename(final)
        except OSError:  # another benchmark built the same checkpoint meanwhile: keep its complete folder
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------- workload


def make_workload(n: int, min_new: int, max_new: int, image_sides: tuple[int, ...], seed: int = 0) -> list[BenchRequest]:
    """``n`` requests: prompts of 4..120 words, every other one with a unique noise image, and
    ``max_new_tokens`` evenly spread over ``min_new..max_new``, all in shuffled order."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    pixels = np.random.default_rng(seed)
    budgets = [min_new + round(i * (max_new - min_new) / max(1, n - 1)) for i in range(n)]
    rng.shuffle(budgets)
    requests = []
    for i in range(n):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 120))) + "?"
        content = [{"type": "text", "text": text}]
        has_image = i % 2 == 0
        if has_image:
            w, h = rng.choice(image_sides), rng.choice(image_sides)
            image = Image.fromarray(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8))
            content.insert(0, {"type": "image", "image": image})
        requests.append(BenchRequest(i, [{"role": "user", "content": content}], budgets[i], has_image))
    rng.shuffle(requests)
    return requests


def poisson_arrivals(n: int, rate_per_s: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(rate_per_s)
    return arrivals


# ----------------------------------------------------------------------------- ways 1 and 2: generate()


class StepClock:
    """A ``generate()`` streamer that stamps every decoding step (the first ``put`` is the prompt)."""

    def __init__(self):
        self.stamps: list[float] = []
        self._seen_prompt = False

    def put(self, value):
        if self._seen_prompt:
            self.stamps.append(time.perf_counter())
        self._seen_prompt = True

    def end(self):
        pass


def _generate(model, processor, requests: list[BenchRequest], max_new_tokens: int) -> tuple[list[list[int]], StepClock]:
    from transformers import GenerationConfig

    inputs = processor.apply_chat_template([r.messages for r in requests], add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt",
                                           processor_kwargs={"padding": True})
    inputs = inputs.to(model.device)
    # min_new_tokens backs up the silenced EOS row (see the module docstring), like ignore_eos in the engine.
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=processor.tokenizer.pad_token_id)
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(**inputs, generation_config=config, streamer=clock)
    new = out[:, inputs["input_ids"].shape[1]:]
    eos = model.generation_config.eos_token_id
    # A row ends where it first emitted EOS (generate pads after it), else it is the full run.
    rows = []
    for row in new.tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows, clock


def run_generate(model, processor, requests, arrivals, batch_size: int, way: str, pattern: str) -> WayResult:
    """Serve ``requests`` arriving at ``arrivals`` (s) with ``generate()``, ``batch_size`` at a time."""
    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    result = WayResult(way, pattern)
    start = time.perf_counter()
    while order:
        now = time.perf_counter() - start
        if arrivals[order[0]] > now:
            time.sleep(arrivals[order[0]] - now)
            now = time.perf_counter() - start
        batch = [i for i in order if arrivals[i] <= now][:batch_size]
        order = [i for i in order if i not in batch]
        budgets = [requests[i].max_new_tokens for i in batch]
        rows, clock = _generate(model, processor, [requests[i] for i in batch], max(budgets))
        result.decode_steps += len(clock.stamps) - 1  # the first token comes from the prefill
        result.decode_rows += (len(clock.stamps) - 1) * len(batch)
        result.prefill_rows += len(batch) * max(requests[i].prompt_tokens for i in batch)  # left-padded
        for i, budget, ids in zip(batch, budgets, rows):
            used = min(budget, len(ids))  # a row past its own budget is padding work, not output
            result.outcomes.append(Outcome(requests[i].index, arrivals[i], clock.stamps[0] - start,
                                           clock.stamps[used - 1] - start, used, tuple(ids[:used])))
    return result


# ----------------------------------------------------------------------------- way 3: the engine


def run_engine(engine, requests, arrivals, pattern: str, way: str = "engine") -> WayResult:
    """Submit each request to the running engine at its arrival time and collect the results."""
    from engine import SamplingParams

    before = engine.stats()
    steps: list[tuple[float, int]] = []  # (seconds, rows) of every decode forward
    decode = engine.runner.decode

    def timed_decode(batch):
        t = time.perf_counter()
        needed = int(batch.seq_lens.sum()) + len(batch)
        try:
            return decode(batch)
        finally:
            steps.append((time.perf_counter() - t, len(batch)))
            # What the step's attention read, as the batch records it (varlen runs or one padded call).
            padding.append((batch.last_attended, needed))
    padding: list[tuple[int, int]] = []  # per step: K/V positions attention spans, and those rows really have
    engine.runner.decode = timed_decode
    prefill_s: list[float] = []

    def timed(fn):  # a prefill's time, one prompt's or a batched one's (engine/batch/prefill_batch.py), in prefill_s
        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                prefill_s.append(time.perf_counter() - t)
        return run
    prefill, together = engine.runner.prefill, engine.runner.prefill_together  # put back after the run
    engine.runner.prefill, engine.runner.prefill_together = timed(prefill), timed(together)
    start = time.perf_counter()
    lags: list[tuple[int, float]] = []
    results, finished = {}, {}

    def wait(index, handle):  # one waiter per request, started at submission, stamps its end
        results[index] = handle.result()
        finished[index] = time.perf_counter() - start

    waiters = []
    for i in sorted(range(len(requests)), key=lambda i: arrivals[i]):
        delay = arrivals[i] - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        lags.append((i, time.perf_counter() - start - arrivals[i]))
        params = SamplingParams(max_new_tokens=requests[i].max_new_tokens, temperature=0.0, ignore_eos=True)
        waiters.append(threading.Thread(target=wait, args=(i, engine.add_request(requests[i].messages, params))))
        waiters[-1].start()
    for w in waiters:
        w.join()
    engine.runner.decode, engine.runner.prefill, engine.runner.prefill_together = decode, prefill, together
    after = engine.stats()
    out = WayResult(way, pattern, decode_steps=after["decode_steps"] - before["decode_steps"],
                    decode_rows=after["decode_rows"] - before["decode_rows"],
                    prefill_rows=after["prefill_tokens"] - before["prefill_tokens"],
                    single_row_steps=sum(rows == 1 for _, rows in steps),
                    single_row_s=sum(s for s, rows in steps if rows == 1),
                    padding_share=1 - sum(n for _, n in padding) / max(1, sum(a for a, _ in padding)),
                    prefill_s=sum(prefill_s), decode_s=sum(s for s, _ in steps))
    for i, lag in lags:
        r = results[i]
        if r.error:
            raise RuntimeError(f"engine request {i} failed: {r.error}")
        first = arrivals[i] + lag + (r.stats.ttft_s or 0.0)
        out.outcomes.append(Outcome(requests[i].index, arrivals[i], first, finished[i], len(r.token_ids),
                                    tuple(r.token_ids)))
    return out


def engine_overrides(way: str) -> dict:
    """The EngineConfig fields an engine way sets: ``engine`` none, ``engine-unpacked`` no CPU kernels,
    ``engine-cpu-a+b`` the CPU kernels a and b alone."""
    if way == "engine-unpacked":
        return {"cpu_kernels": "off"}
    if way.startswith("engine-cpu-"):
        return {"cpu_kernels": way.removeprefix("engine-cpu-").replace("+", ",")}
    if way != "engine":
        raise SystemExit(f"unknown way {way!r}")
    return {}


def start_engine(ckpt: Path, dtype: torch.dtype, args, **overrides):
    from engine import EngineConfig, LLMEngine

    config = EngineConfig(model=str(ckpt), dtype=str(dtype).replace("torch.", ""), device=args.device,
                          max_running=args.max_running, session_cache=False, default_deadline_s=None, **overrides)
    engine = LLMEngine(config)
    engine.start()
    return engine


# ----------------------------------------------------------------------------- report


def print_table(results: list[WayResult], requests: list[BenchRequest]) -> None:
    """One row per (pattern, way). ``steps`` and ``useful`` count model work, so they are free of the
    timing noise of a shared machine: decode forward passes, and the share of rows they computed that
    a request needed (its max_new_tokens - 1 decode rows; the first token comes from the prefill)."""
    needed = sum(r.max_new_tokens - 1 for r in requests)
    print(f"{'pattern':8} {'way':15} {'tok/s':>8} {'req/s':>7} {'TTFT p50':>9} {'TTFT p95':>9} "
          f"{'makespan':>9} {'steps':>6} {'useful':>7} {'engine x':>9}")
    for r in results:
        engine = next((e for e in results if e.pattern == r.pattern and e.way == "engine"), None)
        ratio = f"{engine.tokens_per_s / r.tokens_per_s:8.2f}x" if engine else f"{'-':>9}"
        useful = f"{100 * needed / r.decode_rows:6.0f}%" if r.decode_rows else f"{'-':>7}"
        print(f"{r.pattern:8} {r.way:15} {r.tokens_per_s:8.1f} {r.requests_per_s:7.2f} {r.ttft_percentile(0.5):8.2f}s "
              f"{r.ttft_percentile(0.95):8.2f}s {r.makespan_s:8.1f}s {r.decode_steps:6d} {useful} {ratio}")


def work_ceiling(engine: WayResult, static: WayResult) -> str:
    """How far ahead of static batching the counted work alone lets the engine be: static's decode forwards
    and (padded) prompt rows, priced at the engine's own measured cost per decode forward and per prompt row,
    against the engine's forward time. An estimate that counts work, not a timing of static batching: past it,
    a lead needs cheaper forwards, not better batching."""
    per_step = engine.decode_s / engine.decode_steps
    per_row = engine.prefill_s / engine.prefill_rows
    priced = per_step * static.decode_steps + per_row * static.prefill_rows
    return (f"{engine.pattern} work: static ran {static.decode_steps} decode forwards and {static.prefill_rows} prompt "
            f"rows, the engine {engine.decode_steps} and {engine.prefill_rows}; priced at the engine's own cost per "
            f"forward and per row, static's work is {priced:.1f}s against the engine's {engine.prefill_s + engine.decode_s:.1f}s "
            f"of forwards: a lead of about {priced / (engine.prefill_s + engine.decode_s):.2f}x is what batching alone allows")


def same_tokens_as_sequential(results: list[WayResult]) -> dict[str, float]:
    """Per way (and pattern), the share of requests whose tokens equal the per-request ``generate()`` run's (the
    sequential way, the ground truth). Batched fp32 arithmetic may round differently; greedy tokens should not."""
    truth = {o.index: o.token_ids for r in results if r.way == "sequential" for o in r.outcomes}
    shares = {}
    if not truth:
        return shares
    for r in results:
        if r.way == "sequential":
            continue
        same = sum(o.token_ids == truth.get(o.index) for o in r.outcomes)
        print(f"  {r.pattern:8} {r.way:15} tokens equal to per-request generate() for {same} of "
              f"{len(r.outcomes)} requests")
        shares[f"{r.pattern} {r.way}"] = same / len(r.outcomes)
    return shares


def check_equal_work(requests, results: list[WayResult]) -> bool:
    """Every way must produce every request's full budget, or the comparison is unfair."""
    budget = {r.index: r.max_new_tokens for r in requests}
    ok = True
    for r in results:
        produced = {o.index: o.generated_tokens for o in r.outcomes}
        wrong = sorted(i for i in budget if produced.get(i) != budget[i])
        print(f"  {r.pattern:8} {r.way:15} generated {sum(produced.values())} of {sum(budget.values())} tokens"
              + (f"; requests off budget: {wrong}" if wrong else "; every request exactly its max_new_tokens"))
        ok &= not wrong
    return ok


# ----------------------------------------------------------------------------- main


# --quick (and --tiny): the tiny shape with short budgets, 16 requests, one burst run per way, a shorter profile.
QUICK = dict(requests=16, burst_repeats=1, profile_context=256, profile_steps=8, burst_turns=16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quick_flag(p, "--tiny")  # the tiny shape and short budgets
    p.add_argument("--shape", choices=["small", "lfm2-vl-1.6b"], default="small")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="every way runs this dtype (auto: the engine's rule, bf16 on CPUs with native bf16)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-running", type=int, default=16, help="engine batch size = static batch size")
    p.add_argument("--patterns", default="burst,poisson", help="comma list of burst, poisson")
    p.add_argument("--ways", default="sequential,static,engine",
                   help="comma list of sequential, static, engine, engine-unpacked, engine-cpu-<kernels> (e.g. "
                        "engine-cpu-onednn, engine-cpu-packed+panel)")
    p.add_argument("--burst-repeats", type=int, default=2,
                   help="burst runs of static and engine, alternated; each way's best counts (load on a shared "
                        "machine drifts by tens of percent within minutes). Sequential runs once")
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals per second (default: 0.7 x the engine's burst requests/s)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads, 0 for torch's choice. Default 1: on a shared 2-core machine two "
                        "intra-op threads spin against other processes (measured 7x slower decode)")
    p.add_argument("--cache-dir", default=None, help="where bench checkpoints are cached (default .cache/bench-models)")
    p.add_argument("--burst-turns", type=int, default=64,
                   help="image turns in the batched-prefill burst (bench/prefill_burst.py), run after the workload")
    p.add_argument("--burst-prefill-budget", type=int, default=4096,
                   help="max_prefill_tokens of the burst's two engines")
    p.add_argument("--no-prefill-burst", action="store_true", help="skip the batched-prefill burst")
    p.add_argument("--profile", action="store_true",
                   help="instead of the workload: where one decode step's time goes (see bench/step_profile.py)")
    p.add_argument("--profile-context", type=int, default=1000, help="--profile: prompt tokens per row")
    p.add_argument("--profile-steps", type=int, default=20, help="--profile: decode steps timed per cache")
    p.add_argument("--profile-pool-mb", type=float, default=1024, help="--profile: slot pool budget")
    return parse_with_quick(p, argv, QUICK)


def main(argv=None) -> dict:
    args = parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from engine.models.model_runner import resolve_dtype  # the engine's own "auto" rule, so both sides run one dtype

    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    shape = "tiny" if args.quick else args.shape
    min_new, max_new = (4, 16) if args.quick else (8, 128)
    dtype = resolve_dtype(args.dtype, torch.device(args.device))
    cache_dir = Path(args.cache_dir) if args.cache_dir else root / ".cache" / "bench-models"
    ckpt = bench_checkpoint(shape, cache_dir)
    model = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=dtype).to(args.device).eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    processor.tokenizer.padding_side = "left"  # generate() batches must be left-padded
    if args.profile:
        from bench.step_profile import run_profile

        del model
        print(machine_line(args.device, dtype))
        headline = {"shape": shape, "device": args.device, "dtype": str(dtype).replace("torch.", ""),
                    **run_profile(ckpt, dtype, args)}
        print("RESULT " + json.dumps(headline))
        return headline
    requests = make_workload(args.requests, min_new, max_new, SHAPES[shape]["image_sides"])
    for r in requests:
        r.prompt_tokens = len(processor.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"][0])
    params = sum(p.numel() for p in model.parameters())
    print(machine_line(args.device, dtype))
    prompts = [r.prompt_tokens for r in requests]
    print(f"model: LFM2-VL '{shape}' random init, {params / 1e6:.1f}M parameters | {len(requests)} requests, "
          f"{sum(r.has_image for r in requests)} with an image, prompt tokens {min(prompts)}..{max(prompts)} "
          f"(mean {statistics.mean(prompts):.0f}), max_new_tokens {min_new}..{max_new}, "
          f"{sum(r.max_new_tokens for r in requests)} tokens to generate, max_running {args.max_running}")

    engines = {way: start_engine(ckpt, dtype, args, **engine_overrides(way))
               for way in ways if way.startswith("engine")}
    try:
        warm = requests[:2]  # first calls pay one-off costs (allocator, oneDNN, vision tower)
        run_generate(model, processor, warm, [0.0] * len(warm), 2, "warmup", "warmup")
        for engine in engines.values():
            run_engine(engine, warm, [0.0] * len(warm), "warmup")
        results: list[WayResult] = []
        patterns = [p.strip() for p in args.patterns.split(",") if p.strip()]
        rate = args.rate
        for pattern in patterns:
            if pattern == "burst":
                arrivals = [0.0] * len(requests)
            elif pattern == "poisson":
                if rate is None:
                    burst = next((r for r in results if r.way == "engine" and r.pattern == "burst"), None)
                    rate = 0.7 * burst.requests_per_s if burst else 0.5
                arrivals = poisson_arrivals(len(requests), rate)
                print(f"poisson: {rate:.2f} requests/s, last arrival at {arrivals[-1]:.1f}s")
            else:
                raise SystemExit(f"unknown pattern {pattern!r}")
            repeats = args.burst_repeats if pattern == "burst" else 1
            best: dict[str, WayResult] = {}
            for attempt in range(repeats):
                for way in ways:
                    if way == "sequential" and attempt:
                        continue  # the slowest way, and the farthest from its target: once is enough
                    if way in engines:
                        res = run_engine(engines[way], requests, arrivals, pattern, way)
                    else:
                        size = 1 if way == "sequential" else args.max_running
                        res = run_generate(model, processor, requests, arrivals, size, way, pattern)
                    print(f"  {pattern} {way}: {res.makespan_s:.1f}s, {res.tokens_per_s:.1f} tok/s", flush=True)
                    if way not in best or res.tokens_per_s > best[way].tokens_per_s:
                        best[way] = res
            results += [best[way] for way in ways]
    finally:
        for engine in engines.values():
            engine.stop()

    print_table(results, requests)
    for r in results:
        if r.way.startswith("engine"):
            print(f"  {r.pattern} {r.way}: batch-of-one tail {r.single_row_steps} steps, {r.single_row_s:.1f}s "
                  f"({100 * r.single_row_s / r.makespan_s:.0f}% of the makespan); {100 * r.padding_share:.0f}% of "
                  f"the K/V positions decode attention spanned were padding")
            print(f"  {r.pattern} {r.way}: {r.prefill_s:.1f}s in prefill forwards (vision included) and "
                  f"{r.decode_s:.1f}s in {r.decode_steps} decode forwards, of a {r.makespan_s:.1f}s makespan")
            static = next((s for s in results if s.pattern == r.pattern and s.way == "static"), None)
            if static and r.decode_steps and r.prefill_rows and r.way == "engine":
                print("  " + work_ceiling(r, static))
    if not args.no_prefill_burst:  # batched against one-at-a-time prefill (bench/prefill_burst.py)
        from bench.prefill_burst import compare

        burst = compare(ckpt, dtype, args.device, SHAPES[shape]["image_sides"], args.burst_turns,
                        args.burst_prefill_budget, answer=8, repeats=args.burst_repeats)
    equal = check_equal_work(requests, results)
    print(f"equal work in every way: {'yes' if equal else 'NO: ratios are not comparable'}")
    same = same_tokens_as_sequential(results)
    headline = {"shape": shape, "device": args.device, "dtype": str(dtype).replace("torch.", ""), "tokens_equal": equal}
    if same:
        headline["engine_same_tokens_as_generate"] = min(v for k, v in same.items() if k.endswith(" engine"))
    for pattern in patterns:
        by_way = {r.way: r for r in results if r.pattern == pattern}
        suffix = "" if pattern == "burst" else f"_{pattern}"
        for way in ("sequential", "static", "engine-unpacked"):
            if "engine" in by_way and way in by_way:
                headline[f"vs_{way.replace('-', '_')}{suffix}"] = round(by_way["engine"].tokens_per_s / by_way[way].tokens_per_s, 2)
        for way, r in by_way.items():
            headline[f"{way.replace('-', '_')}_tok_s{suffix}"] = round(r.tokens_per_s, 1)
        if "engine" in by_way:
            headline[f"engine_single_row_tail_pct{suffix}"] = round(
                100 * by_way["engine"].single_row_s / by_way["engine"].makespan_s, 1)
    if not args.no_prefill_burst:
        headline.update(burst)
    print("RESULT " + json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
