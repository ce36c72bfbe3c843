"""Turn one decode step's logits into next tokens, row by row with each request's own parameters.

Greedy rows use argmax, exactly as ``generate(do_sample=False)`` does, so batching never changes their tokens.
Sampled rows draw from their request's own ``torch.Generator``, so a seeded request is reproducible whatever
else shares the batch. A row with a repetition penalty first has the logit of every token already in its sequence
(prompt and answer) divided by the penalty when positive and multiplied by it when negative, as transformers'
``RepetitionPenaltyLogitsProcessor`` does in ``generate()`` (greedy or not): all such rows in one indexed update.
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
                       generators: list[torch.Generator | None],
                       seen: list[tuple[torch.Tensor, list[int]] | None] | None = None) -> list[int]:
    """``logits`` is [rows, vocab]; returns one token id per row. ``seen[row]``: the row's sequence so far, as its
    prompt's distinct ids (a tensor on the logits' device) and its answer's ids, where its repetition penalty needs
    them. Float32 logits are penalised in place: a step's logits are read once, here."""
    logits = logits.float()
    if seen is not None:
        logits = penalise_repetitions(logits, params, seen)
    out = logits.argmax(dim=-1).tolist()
    for row, p in enumerate(params):
        if not p.greedy:
            out[row] = _sample_row(logits[row], p, generators[row])
    return out


def penalised(params: SamplingParams) -> bool:
    return params.repetition_penalty is not None and params.repetition_penalty != 1.0


@torch.inference_mode()  # the model's logits are inference tensors: changed in place only in this mode
def penalise_repetitions(logits: torch.Tensor, params: list[SamplingParams],
                         seen: list[tuple[torch.Tensor, list[int]] | None]) -> torch.Tensor:
    """``logits`` [rows, vocab] (float32), changed in place: each penalised row's seen tokens weighed down. A token
    seen twice is indexed twice: both writes carry the same value, computed from the logits before the update. The
    prompts' ids must be below the logits' width (``LLMEngine`` drops the others, which can never be chosen, as
    transformers does)."""
    rows = [row for row, p in enumerate(params) if penalised(p) and seen[row] is not None]
    if not rows:
        return logits
    device = logits.device
    prompts = [seen[row][0] for row in rows]
    answers = [seen[row][1] for row in rows]
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers)]
    counts, total = torch.tensor(lengths, device=device), sum(lengths)  # the total given: no wait on the device
    row_of = torch.repeat_interleave(torch.tensor(rows, device=device), counts, output_size=total)
    answer_ids = torch.tensor([t for a in answers for t in a], dtype=torch.long, device=device)
    # per row, its prompt's ids then its answer's, in the order counts gives them
    parts = []
    start = 0
    for prompt, answer in zip(prompts, answers):
        parts += [prompt, answer_ids[start:start + len(answer)]]
        start += len(answer)
    token = torch.cat(parts)
    factor = torch.tensor([params[row].repetition_penalty for row in rows], dtype=logits.dtype,
                          device=device)
    factor = torch.repeat_interleave(factor, counts, output_size=total)
    picked = logits[row_of, token]
    logits.index_put_((row_of, token), torch.where(picked < 0, picked * factor, picked / factor))
    return logits


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
