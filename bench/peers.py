"""Peer benchmark: Owlet's engine against transformers' own continuous batching, same weights, same prompts.

The peer a transformers user would reach for is ``init_continuous_batching`` (what ``generate_batch`` and
``transformers serve --continuous-batching`` use). It takes text token ids only and runs ``LlamaForCausalLM``-style
models, so the comparison is text-only on a Llama: a LLaVA checkpoint (the shape of ``bench.engine``'s "small", 87M
text parameters) serves Owlet, and its language model, saved once as a plain ``LlamaForCausalLM``, serves the peer.
Both get the same prompt token ids (checked) and decode greedily in fp32.

Fairness:
- the peer runs its CPU paged attention (``attn_implementation="paged|sdpa"``), at most ``max_running`` requests
  per batch (Owlet's batch size), and a batch-token budget picked by a short sweep on a warm-up workload
  (``--hf-batch-tokens``; the best of the sweep is used);
- both are warmed up on the same warm-up requests before anything is timed, and the timed burst alternates the
  two ``--repeats`` times, each keeping its best run (load on a shared machine drifts within minutes);
- the checkpoint's EOS rows are zeroed (see ``bench.engine``), so every request produces exactly its
  ``max_new_tokens`` in both, and the tokens are compared request by request.

Run: ``python -m bench.peers`` (3-5 minutes on 2 shared cores) or ``--quick`` (seconds; ``--tiny`` is the same).
Last line: ``RESULT {json}`` with ``vs_hf_cb`` = Owlet tokens/s ÷ peer tokens/s. ``--with-nn-linear`` also times
Owlet with every matmul through the model's own ``nn.Linear`` (``cpu_kernels=off``: engine/models/cpu/ unused), alternated
with the other two (``vs_owlet_nn_linear``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.engine import _WORDS, SHAPES
from bench.machine import machine_line
from bench.quick import add_quick_flag, parse_with_quick

_CHECKPOINT_VERSION = 1


def peer_checkpoint(shape: str, cache_dir: Path) -> Path:
    """A LLaVA checkpoint with the ``shape``'s Llama text model, EOS silenced, and its language model saved as a
    ``LlamaForCausalLM`` under ``lm/`` (the same tensors)."""
    from transformers import AutoModelForImageTextToText, LlamaForCausalLM

    from training.tiny_checkpoint import build_llava_checkpoint, silence_eos, train_tokenizer

    text = dict(SHAPES[shape]["text"], max_position_embeddings=4096) if shape != "tiny" else {}
    key = hashlib.sha256(json.dumps([shape, _CHECKPOINT_VERSION, repr(text)]).encode()).hexdigest()[:10]
    final = cache_dir / f"peer-llava-{shape}-{key}"
    if (final / "lm" / "config.json").exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".peer-", dir=cache_dir))
    try:
        tokenizer = train_tokenizer()
        build_llava_checkpoint(tmp, tokenizer=tokenizer, text_overrides=text)
        silence_eos(tmp, tokenizer.eos_token_id)
        vlm = AutoModelForImageTextToText.from_pretrained(tmp, dtype=torch.float32)
        lm = LlamaForCausalLM(vlm.config.text_config)
        lm.model.load_state_dict(vlm.model.language_model.state_dict())
        lm.lm_head.load_state_dict(vlm.lm_head.state_dict())
        lm.generation_config = vlm.generation_config
        lm.save_pretrained(tmp / "lm")
        tokenizer.save_pretrained(tmp / "lm")
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def make_prompts(n: int, min_new: int, max_new: int, seed: int = 0) -> list[tuple[list, int]]:
    """``n`` text-only chats of 4..120 words with ``max_new_tokens`` spread evenly over min..max, shuffled."""
    rng = random.Random(seed)
    budgets = [min_new + round(i * (max_new - min_new) / max(1, n - 1)) for i in range(n)]
    rng.shuffle(budgets)
    out = []
    for b in budgets:
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 120))) + "?"
        out.append(([{"role": "user", "content": [{"type": "text", "text": text}]}], b))
    return out


# ----------------------------------------------------------------------------- the two ways


def run_owlet(engine, prompts) -> tuple[float, list[list[int]]]:
    """Submit every prompt at once; seconds from submission to the last token, and each request's tokens."""
    from engine import SamplingParams

    start = time.perf_counter()
    handles = [engine.add_request(msgs, SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True))
               for msgs, n in prompts]
    results = [h.result() for h in handles]
    elapsed = time.perf_counter() - start
    for r in results:
        if r.error:
            raise RuntimeError(f"owlet request failed: {r.error}")
    return elapsed, [list(r.token_ids) for r in results]


class HFPeer:
    """transformers' continuous batching manager, started once (its own warm-up included) and reused."""

    def __init__(self, lm, max_running: int, max_batch_tokens: int, page_size: int, num_blocks: int):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.lm = lm
        gen = GenerationConfig(do_sample=False, max_new_tokens=16, eos_token_id=lm.generation_config.eos_token_id,
                               pad_token_id=lm.generation_config.pad_token_id)
        cb = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_running,
                                      page_size=page_size, num_blocks=num_blocks, allow_block_sharing=False)
        self.manager = lm.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.manager.start()

    def run(self, token_ids: list[list[int]], budgets: list[int]) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        ids = [self.manager.add_request(t, max_new_tokens=n) for t, n in zip(token_ids, budgets)]
        done: dict[str, list[int]] = {}
        deadline = time.monotonic() + 3600
        while len(done) < len(ids):
            out = self.manager.get_result(timeout=1)
            if out is not None and out.is_finished():
                if out.error:
                    raise RuntimeError(f"transformers CB request failed: {out.error}")
                done[out.request_id] = list(out.generated_tokens)
            if time.monotonic() > deadline or not self.manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped before finishing")
        elapsed = time.perf_counter() - start
        return elapsed, [done[i] for i in ids]

    def stop(self):
        self.manager.stop(block=True, timeout=10)
        destroy = getattr(self.lm, "destroy_cached_continuous_batching_manager", None)
        if destroy:
            destroy()


# ----------------------------------------------------------------------------- main


# --quick (and --tiny): the tiny shape with short budgets, 16 requests, one timed burst per way, a two-point sweep.
QUICK = dict(requests=16, repeats=1, hf_batch_tokens="256,512")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick_flag(p, "--tiny")  # the tiny shape and short budgets
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-running", type=int, default=16, help="Owlet's batch size = the peer's requests per batch")
    p.add_argument("--repeats", type=int, default=2, help="timed bursts per way, alternated; best counts")
    p.add_argument("--hf-batch-tokens", default="256,512,1024",
                   help="comma list of the peer's max_batch_tokens to try on the warm-up; the fastest is used")
    p.add_argument("--page-size", type=int, default=64, help="the peer's KV page size in tokens")
    p.add_argument("--with-nn-linear", action="store_true",
                   help="also time Owlet with every matmul through the model's own nn.Linear (cpu_kernels=off), "
                        "alternated with the others: the CPU kernels' share of the lead")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (see bench.engine --threads)")
    p.add_argument("--cache-dir", default=None)
    return parse_with_quick(p, argv, QUICK)


def main(argv=None) -> dict:
    args = parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import LlamaForCausalLM

    from engine import EngineConfig, LLMEngine

    shape = "tiny" if args.quick else "small"
    min_new, max_new = (4, 16) if args.quick else (8, 128)
    ckpt = peer_checkpoint(shape, Path(args.cache_dir) if args.cache_dir else root / ".cache" / "bench-models")
    def owlet_engine(**kernels):
        return LLMEngine(EngineConfig(model=str(ckpt), dtype="float32", device="cpu", max_running=args.max_running,
                                      session_cache=False, default_deadline_s=None, **kernels)).start()
    engine = owlet_engine()
    plain = owlet_engine(cpu_kernels="off") if args.with_nn_linear else None
    lm = LlamaForCausalLM.from_pretrained(ckpt / "lm", dtype=torch.float32, attn_implementation="paged|sdpa").eval()
    prompts = make_prompts(args.requests, min_new, max_new)
    warm = make_prompts(8, min_new, max_new, seed=1)
    ids = [engine.prompts.build(m).token_ids for m, _ in prompts]
    warm_ids = [engine.prompts.build(m).token_ids for m, _ in warm]
    budgets, warm_budgets = [n for _, n in prompts], [n for _, n in warm]
    print(machine_line("cpu", torch.float32))
    params = sum(p.numel() for p in lm.parameters())
    print(f"model: LLaVA '{shape}' language model = LlamaForCausalLM, {params / 1e6:.1f}M parameters, fp32 | "
          f"{len(prompts)} text-only requests at once, prompt tokens {min(map(len, ids))}..{max(map(len, ids))}, "
          f"max_new_tokens {min_new}..{max_new} ({sum(budgets)} tokens), max_running {args.max_running}")

    # Sized like Owlet's batch: max_running sequences of the longest prompt + budget (the peer's memory probe
    # does not work on CPU, and its fallback allocates far more than this workload needs).
    longest = max(map(len, ids + warm_ids)) + max_new
    blocks = args.max_running * -(-longest // args.page_size) + args.max_running
    peer = None
    try:
        # Warm-up: Owlet twice on the warm-up set; the peer once per batch-token budget, the best one kept.
        for _ in range(2):
            run_owlet(engine, warm)
            if plain:
                run_owlet(plain, warm)
        best_tokens, best_s = None, float("inf")
        for tokens in [int(t) for t in args.hf_batch_tokens.split(",") if t.strip()]:
            candidate = HFPeer(lm, args.max_running, tokens, args.page_size, blocks)
            candidate.run(warm_ids, warm_budgets)  # its first run pays one-off costs
            s, _ = candidate.run(warm_ids, warm_budgets)
            print(f"  tune: transformers CB max_batch_tokens={tokens}: warm-up set {s:.2f}s")
            if s < best_s:
                best_tokens, best_s = tokens, s
            candidate.stop()
        peer = HFPeer(lm, args.max_running, best_tokens, args.page_size, blocks)
        peer.run(warm_ids, warm_budgets)

        times = {"owlet": [], "hf_cb": [], **({"owlet_nn_linear": []} if plain else {})}
        tokens_out = {}
        for attempt in range(args.repeats):
            s, toks = run_owlet(engine, prompts)
            times["owlet"].append(s)
            tokens_out["owlet"] = toks
            print(f"  burst {attempt + 1}: owlet {s:.1f}s", flush=True)
            if plain:
                s, tokens_out["owlet_nn_linear"] = run_owlet(plain, prompts)
                times["owlet_nn_linear"].append(s)
                print(f"  burst {attempt + 1}: owlet (nn.Linear) {s:.1f}s", flush=True)
            s, toks = peer.run(ids, budgets)
            times["hf_cb"].append(s)
            tokens_out["hf_cb"] = toks
            print(f"  burst {attempt + 1}: transformers CB {s:.1f}s", flush=True)
    finally:
        engine.stop()
        if plain:
            plain.stop()
        if peer:
            peer.stop()

    total = sum(budgets)
    exact = [len(t) == n for way in times for t, n in zip(tokens_out[way], budgets)]
    agree = sum(a == b for a, b in zip(tokens_out["owlet"], tokens_out["hf_cb"]))
    rate = {w: total / min(t) for w, t in times.items()}
    print(f"\n{'way':38} {'best s':>7} {'tok/s':>8} {'owlet x':>8}")
    labels = {"owlet": "owlet engine", "hf_cb": f"transformers CB (paged|sdpa, {best_tokens} tok)",
              "owlet_nn_linear": "owlet engine, nn.Linear kernels"}
    for way in [w for w in ("hf_cb", "owlet_nn_linear", "owlet") if w in times]:
        print(f"{labels[way]:38} {min(times[way]):7.1f} {rate[way]:8.1f} {rate['owlet'] / rate[way]:7.2f}x")
    print(f"token agreement: {agree}/{len(prompts)} requests identical; every request exactly its budget: "
          f"{'yes' if all(exact) else 'NO'}")
    if plain:
        same = sum(a == b for a, b in zip(tokens_out["owlet"], tokens_out["owlet_nn_linear"]))
        print(f"owlet with its CPU kernels vs nn.Linear: {same}/{len(prompts)} requests identical")
    result = dict(shape=shape, dtype="float32", requests=len(prompts), hf_batch_tokens=best_tokens,
                  owlet_tok_s=round(rate["owlet"], 1), hf_cb_tok_s=round(rate["hf_cb"], 1),
                  vs_hf_cb=round(rate["owlet"] / rate["hf_cb"], 2), tokens_agree=agree == len(prompts),
                  requests_agree=agree, equal_work=all(exact))
    if plain:
        result["vs_owlet_nn_linear"] = round(rate["owlet"] / rate["owlet_nn_linear"], 2)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
