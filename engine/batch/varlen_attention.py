"""Decode attention over slots that reads each row's own K/V length, not the batch's longest.

On the slot path a decode step hands attention ``buf[:B, :, :T]``, T being the longest row + 1, with a mask over
each shorter row's tail: a 100-token row batched with a 2,000-token row pays for 2,000 positions. Here the rows
are cut into contiguous runs (``plan_segments``) and each run attends only up to its own longest row; a run whose
rows all have the same length needs no mask at all (SDPA's unmasked path, the one a lone ``generate()`` takes).
Every run's K/V is a view of the slot buffer (rows ``a:b``, positions ``:span``): nothing is copied.

Cutting costs one more attention call per run, so a cut is made only where the padding it saves outweighs a
call (``call_cost``, in row-positions: small on a CPU, large on a GPU, where one padded kernel is cheap and a
launch is not). With one run covering the batch this is exactly the padded step.

The function is registered with transformers' ``AttentionInterface`` as ``owlet_varlen`` and set on the text
model only. It takes the plan through the ``owlet_segments`` forward kwarg, which the model passes down to its
attention calls; without it (prefill, the vision tower, ``generate()``) it is plain SDPA.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "owlet_varlen"
# One extra attention call costs about as much as attending this many row-positions of padding.
CALL_COST = {"cpu": 256, "cuda": 16384}


def plan_segments(spans: list[int], call_cost: int) -> list[tuple[int, int, int, bool]]:
    """Cut rows ``0 .. len(spans)-1`` (row i attends ``spans[i]`` positions) into contiguous runs.

    Returns ``(start, stop, span, ragged)`` per run: rows ``start:stop`` attend ``span`` positions, and
    ``ragged`` says whether some row in it is shorter (so it still needs the mask). Greedy in one pass: a row
    joins the current run when widening the run costs less than a new call plus the row alone.
    """
    runs = []
    start, span, ragged = 0, spans[0], False
    for i in range(1, len(spans)):
        rows, length = i - start, spans[i]
        joined = (rows + 1) * max(span, length)
        cut = rows * span + length + call_cost
        if joined <= cut:
            ragged = ragged or length != span
            span = max(span, length)
        else:
            runs.append((start, i, span, ragged))
            start, span, ragged = i, length, False
    runs.append((start, len(spans), span, ragged))
    return runs


def attended_positions(runs: list[tuple[int, int, int, bool]]) -> int:
    """Row-positions a step's attention reads under ``runs`` (for the benchmark's padding share)."""
    return sum((stop - start) * span for start, stop, span, _ in runs)


def varlen_attention(module, query, key, value, attention_mask, *args, owlet_segments=None, **kwargs):
    if owlet_segments is None or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    if len(owlet_segments) == 1 and not owlet_segments[0][3]:
        start, stop, span, _ = owlet_segments[0]
        return sdpa_attention_forward(module, query, key[:, :, :span], value[:, :, :span], None, *args, **kwargs)
    outputs = []
    for start, stop, span, ragged in owlet_segments:
        mask = attention_mask[start:stop, ..., :span] if ragged else None
        out, _ = sdpa_attention_forward(module, query[start:stop], key[start:stop, :, :span],
                                        value[start:stop, :, :span], mask, *args, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=0), None


AttentionInterface.register(NAME, varlen_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # prefill masks are built as for SDPA


def install(model, text_config) -> bool:
    """Use ``owlet_varlen`` for the text model's attention if it runs SDPA today; returns whether it does now."""
    if getattr(text_config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False  # flash / eager / a kernel the user chose: leave it alone
    for key, sub in (getattr(model.config, "sub_configs", None) or {}).items():
        if getattr(model.config, key, None) is text_config:
            model.set_attn_implementation({key: NAME})
            return text_config._attn_implementation == NAME
    if model.config.get_text_config() is model.config:  # a text-only model
        model.set_attn_implementation(NAME)
        return text_config._attn_implementation == NAME
    return False
