"""Turn one decode step's logits into next tokens, row by row with each request's own parameters.

Greedy rows use argmax, exactly as ``generate(do_sample=False)`` does, so batching never changes their tokens.
Sampled rows draw from their request's own ``torch.Generator``, so a seeded request is reproducible whatever
else shares the batch.
"""
from __future__ import annotations

import torch

from .sampling_params import SamplingParams


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator | None:
    if params.greedy:
        return None
    g = torch.Generator(device="cpu")
    g.manual_seed(params.seed if params.seed is not None else fallback_seed)
    return g


def sample_next_tokens(logits: torch.Tensor, params: list[SamplingParams],
                       generators: list[torch.Generator | None]) -> list[int]:
    """``logits`` is [rows, vocab]; returns one token id per row."""
    logits = logits.float()
    out = logits.argmax(dim=-1).tolist()
    for row, p in enumerate(params):
        if not p.greedy:
            out[row] = _sample_row(logits[row], p, generators[row])
    return out


def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest set whose mass reaches top_p (the first token is always kept)
        drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator).item())
