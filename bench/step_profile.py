"""Where one decode step's time goes (``python -m bench.engine --profile``).

A full batch (``max_running`` rows, 16 by default) of ~``--profile-context``-token text prompts is prefilled, then
``--profile-steps`` engine steps are timed part by part, for each decode cache (``slots`` and ``dynamic``):

- model forward, split into attention (projections, rope, SDPA; cache writes excluded), MLP, LFM2 short conv,
  the LM head, and the rest of the forward (embedding, norms, rotary tables, mask handling, module glue);
- cache and mask bookkeeping: the cache's ``update`` calls (append or in-place write), building the step's
  inputs and mask, ``advance``, the undo point, and dropping rows;
- sampling, detokenisation (with the handle's delta push), and Python overhead: the step minus all of the above.

Timers are wall clock around the real engine code (forward hooks and wrappers installed only here), so they add
a few microseconds per layer; the ``step ms`` line is measured with them in place.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from bench.engine import _WORDS

PARTS = ["attention", "mlp", "conv", "lm_head", "forward_other", "cache_mask", "sampling", "detokenise", "python"]
LABELS = {"attention": "attention (qkv/o proj, rope, SDPA)", "mlp": "MLP", "conv": "LFM2 short conv",
          "lm_head": "LM head", "forward_other": "rest of forward (embed, norms, glue)",
          "cache_mask": "cache + mask bookkeeping", "sampling": "sampling", "detokenise": "detokenise + stream",
          "python": "Python overhead (engine step)"}


class _Timers:
    def __init__(self, device):
        self.total = defaultdict(float)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            self.sync()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.total[part] += time.perf_counter() - t
        return timed

    def hook_module(self, module, part: str):
        starts = []

        def pre(_m, _a):
            self.sync()
            starts.append(time.perf_counter())

        def post(_m, _a, _o):
            self.sync()
            self.total[part] += time.perf_counter() - starts.pop()
        return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def _long_prompt(engine, tokens: int, seed: int) -> list:
    import random

    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(tokens)]
    while True:  # trim to about ``tokens`` prompt tokens
        msgs = [{"role": "user", "content": [{"type": "text", "text": " ".join(words)}]}]
        n = len(engine.prompts.build(msgs).token_ids)
        if n <= tokens or len(words) < 2:
            return msgs
        words = words[:max(1, int(len(words) * tokens / n) - 1)]


def profile_mode(ckpt, dtype, args, mode: str, runner=None) -> dict:
    import engine.llm_engine as llm_engine_module
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.detokenizer import IncrementalDetokenizer

    steps = args.profile_steps
    config = EngineConfig(model=str(ckpt), dtype=str(dtype).replace("torch.", ""), device=args.device,
                          max_running=args.max_running, default_deadline_s=None, decode_cache=mode,
                          max_prefill_tokens=1024, kv_pool_mb=args.profile_pool_mb)
    engine = LLMEngine(config, runner=runner)
    budget = steps + 8
    # Every row gets the same ~1000-token context: a first turn is prefilled once, and the rows are its follow-up,
    # which restores the first prompt from the session cache (the prompt-end checkpoint, so LFM2's conv states
    # come back too) and prefills only the last few tokens. A step's work does not depend on what the context says.
    prompt = _long_prompt(engine, args.profile_context, 0)
    first = engine.add_request(prompt, SamplingParams(max_new_tokens=2, temperature=0.0), session_id="profile")
    while engine.has_work():
        engine.step()
    follow = prompt + [{"role": "assistant", "content": [{"type": "text", "text": first.result(0).text}]},
                       {"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    for i in range(args.max_running):
        engine.add_request(follow, SamplingParams(max_new_tokens=budget, temperature=0.0, ignore_eos=True),
                           session_id="profile")
    while len(engine.batch) < args.max_running:  # restore + 1-token prefills (not timed)
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()
    contexts = engine.batch.seq_lens.float()
    reused = engine.stats()["reused_tokens"]
    assert reused >= args.max_running * len(engine.prompts.build(prompt).token_ids) // 2, "rows were recomputed"

    timers = _Timers(engine.runner.device)
    handles = []
    model = engine.runner.model
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model.language_model
    for layer in decoder.layers:
        for name, part in (("self_attn", "attention"), ("mlp", "mlp"), ("feed_forward", "mlp"), ("conv", "conv")):
            sub = getattr(layer, name, None)
            if sub is not None:
                handles += timers.hook_module(sub, part)
    handles += timers.hook_module(model.lm_head, "lm_head")
    batch = engine.batch
    originals = {}
    for name in ("step_inputs", "advance", "filter", "undo_point"):
        originals[name] = getattr(batch, name)
        # step_inputs runs inside ModelRunner.decode (the "forward" timer): kept apart so it is not counted twice
        setattr(batch, name, timers.wrap("inputs" if name == "step_inputs" else "cache_mask", originals[name]))
    runner_decode = engine.runner.decode
    engine.runner.decode = timers.wrap("forward", runner_decode)
    sample = llm_engine_module.sample_next_tokens
    llm_engine_module.sample_next_tokens = timers.wrap("sampling", sample)
    add_token = IncrementalDetokenizer.add_token
    IncrementalDetokenizer.add_token = timers.wrap("detokenise", add_token)
    # The cache's own update: both caches route every attention layer's write through Cache.update.
    cache_update_cls = type(batch.cache) if batch.cache is not None else None
    update = cache_update_cls.update
    cache_update_cls.update = timers.wrap("cache_update", update)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        timers.sync()
        wall = time.perf_counter() - t0
    finally:
        cache_update_cls.update = update
        IncrementalDetokenizer.add_token = add_token
        llm_engine_module.sample_next_tokens = sample
        engine.runner.decode = runner_decode
        for name, fn in originals.items():
            setattr(batch, name, fn)
        for h in handles:
            h.remove()
        engine.stop()
    t = timers.total
    parts = dict(
        attention=t["attention"] - t["cache_update"],
        mlp=t["mlp"], conv=t["conv"], lm_head=t["lm_head"],
        cache_mask=t["cache_mask"] + t["inputs"] + t["cache_update"],
        sampling=t["sampling"], detokenise=t["detokenise"],
    )
    parts["forward_other"] = t["forward"] - t["inputs"] - t["attention"] - t["mlp"] - t["conv"] - t["lm_head"]
    parts["python"] = wall - t["forward"] - t["cache_mask"] - t["sampling"] - t["detokenise"]
    return dict(mode=mode, step_ms=1000 * wall / steps, rows=args.max_running, runner=engine.runner,
                context=float(contexts.mean()), parts={k: 1000 * v / steps for k, v in parts.items()})


def run_profile(ckpt, dtype, args) -> dict:
    results, runner = [], None
    for mode in ("dynamic", "slots"):
        results.append(profile_mode(ckpt, dtype, args, mode, runner))
        runner = results[-1]["runner"]
    r0 = results[0]
    print(f"\ndecode step profile: {r0['rows']} rows, mean context {r0['context']:.0f} tokens, "
          f"{args.profile_steps} steps timed per cache")
    head = f"{'part':40}" + "".join(f"{r['mode'] + ' ms':>12}{'%':>7}" for r in results)
    print(head)
    for part in PARTS:
        row = f"{LABELS[part]:40}"
        for r in results:
            ms = r["parts"][part]
            row += f"{ms:12.2f}{100 * ms / r['step_ms']:6.1f}%"
        print(row)
    print(f"{'step (wall)':40}" + "".join(f"{r['step_ms']:12.2f}{'':>7}" for r in results))
    out = {"rows": r0["rows"], "context": round(r0["context"])}
    for r in results:
        out[f"{r['mode']}_step_ms"] = round(r["step_ms"], 2)
        out[f"{r['mode']}_bookkeeping_pct"] = round(100 * r["parts"]["cache_mask"] / r["step_ms"], 1)
    out["slots_speedup"] = round(results[0]["step_ms"] / results[1]["step_ms"], 2)
    return out
