"""Tensor-level operations on Hugging Face ``DynamicCache`` objects, for attention and LFM2 conv layers alike.

Attention layers hold keys/values of shape [B, kv_heads, T, head_dim] (after rope). LFM2 conv layers hold one
conv state of shape [B, hidden, L] with no time axis. Batching left-pads the time axis, so a row's real tokens
are the last positions of its time axis.

Sliding-window layers (``DynamicSlidingWindowLayer``: Gemma 3, Mistral with ``sliding_window``) hold only the
last ``min(cumulative_length, window - 1)`` positions of the same (padded) timeline, and ``cumulative_length``
is that timeline's length: the model's mask indexes the 2D attention mask with it. Every operation here keeps
both in step with the full layers. Once a sliding layer has dropped positions ("cropped"), no shorter prefix
can be restored from it (see ``CacheSnapshot.cropped``).

Everything that knows the cache's internals lives here; the batch and the session store call these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .cache_layers import is_conv, is_sliding


def _keep_window(layer) -> None:
    """Hold at most ``window - 1`` positions, as DynamicSlidingWindowLayer.update does."""
    keep = layer.sliding_window - 1
    if layer.keys.shape[-2] > keep:
        layer.keys, layer.values = layer.keys[:, :, -keep:], layer.values[:, :, -keep:]


@dataclass
class CacheSnapshot:
    """A batch-1 cache as plain tensors: what the session store keeps and what parking quantises."""
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (keys, values), [1, H, T, D]
    conv: dict[int, torch.Tensor]  # layer -> conv state [1, C, L], valid only at exactly `length` tokens
    length: int  # tokens covered
    sliding: frozenset = frozenset()  # indices of sliding-window layers (their kv holds at most window - 1)

    @property
    def nbytes(self) -> int:
        n = sum(k.nbytes + v.nbytes for k, v in self.kv.values())
        return n + sum(c.nbytes for c in self.conv.values())

    @property
    def cropped(self) -> bool:
        """A sliding-window layer holds fewer than ``length`` positions: only the full length is restorable."""
        return any(k.shape[-2] < self.length for k, _ in self.kv.values())


def snapshot_row(cache, row: int, length: int) -> CacheSnapshot:
    """Copy row ``row``'s last ``length`` positions out of a (possibly left-padded, batched) cache.

    A sliding-window layer gives only the positions it still holds (at most ``window - 1``)."""
    kv, conv = {}, {}
    for i, layer in enumerate(cache.layers):
        if is_conv(layer):
            conv[i] = layer.conv_states[0][row:row + 1].clone()
        else:
            t = layer.keys.shape[-2]
            n = min(length, t)
            kv[i] = (layer.keys[row:row + 1, :, t - n:].clone(), layer.values[row:row + 1, :, t - n:].clone())
    sliding = frozenset(i for i, layer in enumerate(cache.layers) if is_sliding(layer))
    return CacheSnapshot(kv, conv, length, sliding)


def prefix_of(snap: CacheSnapshot, length: int) -> CacheSnapshot:
    """The first ``length`` tokens of a snapshot of full-attention layers only (no conv state, no sliding window,
    which are valid only at their own length), as tensors of their own."""
    assert not snap.conv and not snap.sliding, "only full-attention K/V can be cut to a shorter prefix"
    kv = {i: (k[:, :, :length].clone(), v[:, :, :length].clone()) for i, (k, v) in snap.kv.items()}
    return CacheSnapshot(kv, {}, length)


def row_cache(cache, row: int, length: int, text_config) -> DynamicCache:
    """Row ``row``'s last ``length`` positions of a left-padded batched cache, as its own batch-1 DynamicCache
    (one copy; a batched prefill hands each request the cache a prefill of its own would have left)."""
    kv, conv = {}, {}
    for i, layer in enumerate(cache.layers):
        if is_conv(layer):
            conv[i] = layer.conv_states[0][row:row + 1]
        else:
            t = layer.keys.shape[-2]
            n = min(length, t)
            kv[i] = (layer.keys[row:row + 1, :, t - n:], layer.values[row:row + 1, :, t - n:])
    sliding = frozenset(i for i, layer in enumerate(cache.layers) if is_sliding(layer))
    return cache_from_snapshot(CacheSnapshot(kv, conv, length, sliding), text_config)


def moved(snap: CacheSnapshot, device) -> CacheSnapshot:
    """The snapshot with its tensors on ``device``: itself when they are there already (no copy)."""
    device = torch.device(device)
    tensors = [t for pair in snap.kv.values() for t in pair] + list(snap.conv.values())
    if all(t.device == device for t in tensors):
        return snap
    kv = {i: (k.to(device), v.to(device)) for i, (k, v) in snap.kv.items()}
    return CacheSnapshot(kv, {i: c.to(device) for i, c in snap.conv.items()}, snap.length, snap.sliding)


def exact_states(snap: CacheSnapshot) -> dict[int, torch.Tensor]:
    """The per-layer state that is valid only at exactly ``snap.length`` tokens: conv states, and each
    sliding-window layer's K/V window (stacked as [2, 1, H, T, D]). A session keeps these as checkpoints."""
    states = dict(snap.conv)
    for i in snap.sliding:
        states[i] = torch.stack(snap.kv[i])
    return states


def cache_from_snapshot(snap: CacheSnapshot, text_config, upto: int | None = None,
                        conv: dict | None = None) -> DynamicCache:
    """A fresh batch-1 DynamicCache holding the snapshot's first ``upto`` tokens (default: all).

    Conv states carry no time axis, so they can only be restored at the length they were taken: either the
    snapshot's own (``upto == snap.length``) or a checkpoint ``conv`` the caller took at ``upto`` (see
    ``exact_states``; it may also hold sliding-window layers' windows, which are then used as they are).
    Otherwise a cropped sliding-window layer can only give back a prefix whose window it still holds.
    """
    upto = snap.length if upto is None else upto
    if conv is None:
        assert upto == snap.length or not snap.conv, "a conv state is only valid at the exact length it was taken"
        conv = snap.conv
    cache = DynamicCache(config=text_config)
    for i, layer in enumerate(cache.layers):
        if is_conv(layer):
            state = conv[i].clone()
            layer.lazy_initialization(conv_states=state, conv_kernel_size=state.shape[-1])
            layer.conv_states[0].copy_(state)
            layer.has_previous_state[0] = True
            continue
        if i in conv:  # a sliding window checkpointed at exactly `upto`
            k, v = conv[i][0], conv[i][1]
            layer.lazy_initialization(k, v)
            layer.keys, layer.values, layer.cumulative_length = k.clone(), v.clone(), upto
            continue
        k, v = snap.kv[i]
        first = snap.length - k.shape[-2]  # timeline position of k[..., 0, :]
        start = max(0, upto - (layer.sliding_window - 1)) if is_sliding(layer) else 0
        assert start >= first, "this sliding-window layer no longer holds the positions that prefix needs"
        layer.lazy_initialization(k, v)
        held = slice(start - first, upto - first)
        layer.keys, layer.values = k[:, :, held].clone(), v[:, :, held].clone()
        if is_sliding(layer):
            layer.cumulative_length = upto
    return cache


def pad_left(cache, n: int) -> None:
    """Prepend ``n`` zero positions to every attention layer (masked out by the caller's attention mask)."""
    if n <= 0:
        return
    for layer in cache.layers:
        if not is_conv(layer):
            b, h, _, d = layer.keys.shape
            layer.keys = torch.cat([layer.keys.new_zeros(b, h, n, d), layer.keys], dim=2)
            layer.values = torch.cat([layer.values.new_zeros(b, h, n, d), layer.values], dim=2)
            if is_sliding(layer):
                layer.cumulative_length += n
                _keep_window(layer)


def append_rows(cache, other) -> None:
    """Concatenate ``other``'s rows after ``cache``'s (both already padded to the same length)."""
    for layer, extra in zip(cache.layers, other.layers):
        if is_conv(layer):
            layer.conv_states[0] = torch.cat([layer.conv_states[0], extra.conv_states[0]], dim=0)
            # A merged row that was prefilled has a state; the flag must say so or the next step drops it.
            layer.has_previous_state[0] = True
        else:
            layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
            layer.values = torch.cat([layer.values, extra.values], dim=0)


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` (in that order). ``reorder_cache`` handles hybrid caches; batch_select_indices does not."""
    cache.reorder_cache(rows)


def trim_left(cache, n: int) -> None:
    """Drop the first ``n`` positions of every attention layer (padding no remaining row needs)."""
    if n <= 0:
        return
    for layer in cache.layers:
        if is_sliding(layer):
            # It holds the timeline's last positions; drop only those that fall before the new start.
            layer.cumulative_length -= n
            extra = layer.keys.shape[-2] - layer.cumulative_length
            if extra > 0:
                layer.keys, layer.values = layer.keys[:, :, extra:], layer.values[:, :, extra:]
        elif not is_conv(layer):
            layer.keys = layer.keys[:, :, n:]
            layer.values = layer.values[:, :, n:]


@dataclass
class StepUndo:
    """What a failed forward may have changed in place: attention lengths and conv states (see ``rollback``)."""
    attn_len: dict[int, int]
    conv: dict[int, torch.Tensor]
    sliding: dict[int, tuple] = None  # layer -> (keys, values, cumulative_length) before the step


def undo_point(cache) -> StepUndo:
    """Cheap record taken before a decode step: conv states are [B, hidden, L], a few KB per row. Sliding
    layers are kept by reference: an update replaces their tensors (torch.cat) rather than writing into them."""
    attn, conv, sliding = {}, {}, {}
    for i, layer in enumerate(cache.layers):
        if is_conv(layer):
            conv[i] = layer.conv_states[0].clone()
        elif is_sliding(layer):
            sliding[i] = (layer.keys, layer.values, layer.cumulative_length)
        else:
            attn[i] = layer.keys.shape[-2]
    return StepUndo(attn, conv, sliding)


def rollback(cache, undo: StepUndo) -> None:
    """Undo a forward that failed half way (e.g. out of memory): layers it reached appended K/V or rewrote
    their conv state in place; the layers it did not reach are untouched."""
    for i, layer in enumerate(cache.layers):
        if is_conv(layer):
            layer.conv_states[0].copy_(undo.conv[i])
        elif is_sliding(layer):
            layer.keys, layer.values, layer.cumulative_length = undo.sliding[i]
        else:
            layer.keys = layer.keys[:, :, :undo.attn_len[i]]
            layer.values = layer.values[:, :, :undo.attn_len[i]]
