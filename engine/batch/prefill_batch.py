"""Batched prefill: the prompts one scheduler step admits run through the model together, in one forward.

A burst of new conversations (a shared link going round) would otherwise pay one forward per prompt before its
first token. Here the step's new prompts are stacked into one ``[B, T]`` batch, **left-padded** to the longest:

- every row's real tokens end at the last position, so one ``logits_to_keep=1`` gives each row's next-token logits;
- the 2D attention mask is 0 over a row's padding, and ``position_ids`` count from 0 at the row's first real
  token, so attention sees exactly the row's own tokens at their own positions;
- LFM2's short convolution zeroes padded inputs before it runs (transformers applies the same 2D mask to conv
  inputs), so padding on the left is what a fresh row's zero conv history is: the conv states at the prompt's end
  are the row's own. That holds only if a zero input gives a zero conv input, i.e. the conv projections have no
  bias (``conv_bias``); with a bias the model is refused here and prefills one at a time.

A row joins only if it starts from nothing: a prefix cached for it (a session's earlier turns) cannot sit under
left padding without a hole between prefix and new tokens, and a hole is not exact for conv layers. The one
exception is the shared template head (a few tokens, the same for every new conversation): it is recomputed in
the batch rather than restored, so every new conversation can join. Follow-up turns, and the later chunks of a
prompt longer than the step's budget, prefill alone as before.

After the forward each row's cache is cut out of the batch (``kv_cache.row_cache``) as the batch-1 cache the rest
of the engine expects (session checkpoints, the decode batch's ``add``), so nothing downstream changes.

``groups`` splits a step's rows into forwards so that padding stays a bounded share of the positions computed.
"""
from __future__ import annotations

# At most this share of the positions a batched forward computes may be padding; a row that would push a group
# past it starts another forward (rows are grouped by length, so a burst of similar prompts stays in one).
MAX_PADDING_SHARE = 0.25


def groups(lengths: list[int], max_padding_share: float = MAX_PADDING_SHARE) -> list[list[int]]:
    """Indices of ``lengths`` split into forwards, longest first: in each, ``B * max(len)`` positions are computed
    for ``sum(len)`` real ones, and the padding share ``1 - real / computed`` stays within ``max_padding_share``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out:
            group = out[-1]
            longest = lengths[group[0]]
            real = sum(lengths[j] for j in group) + lengths[i]
            if 1 - real / (longest * (len(group) + 1)) <= max_padding_share:
                group.append(i)
                continue
        out.append([i])
    return out


def reset_head(request) -> None:
    """Forget a request's cached template head so the batch recomputes it with the rest of the prompt. Its
    embeddings stay if they start at the prompt's start (its own first chunk built them), else they go."""
    if request.scratch.embeds_offset:
        request.scratch.embeds = None
    request.forget_computed()


def starts_fresh(request) -> bool:
    """Whether ``request`` can join a batched prefill: nothing computed yet, or only the shared template head
    (restored for it, or its own first chunk stopped there so the session store could keep it)."""
    head = len(request.prompt.head_ids or ())
    return request.num_computed == 0 or (head > 0 and request.num_computed == head)
