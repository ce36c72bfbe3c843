"""Tensor-level operations on Hugging Face ``DynamicCache`` objects, for attention and LFM2 conv layers alike.

Attention layers hold keys/values of shape [B, kv_heads, T, head_dim] (after rope). LFM2 conv layers hold one
conv state of shape [B, hidden, L] with no time axis. Batching left-pads the time axis, so a row's real tokens
are the last positions of its time axis.

Everything that knows the cache's internals lives here; the batch and the session store call these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin


def _is_conv(layer) -> bool:
    return isinstance(layer, LinearAttentionCacheLayerMixin)


@dataclass
class CacheSnapshot:
    """A batch-1 cache as plain tensors: what the session store keeps and what parking quantises."""
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (keys, values), [1, H, T, D]
    conv: dict[int, torch.Tensor]  # layer -> conv state [1, C, L], valid only at exactly `length` tokens
    length: int  # tokens covered

    @property
    def nbytes(self) -> int:
        n = sum(k.nbytes + v.nbytes for k, v in self.kv.values())
        return n + sum(c.nbytes for c in self.conv.values())


def snapshot_row(cache, row: int, length: int) -> CacheSnapshot:
    """Copy row ``row``'s last ``length`` positions out of a (possibly left-padded, batched) cache."""
    kv, conv = {}, {}
    for i, layer in enumerate(cache.layers):
        if _is_conv(layer):
            conv[i] = layer.conv_states[0][row:row + 1].clone()
        else:
            t = layer.keys.shape[-2]
            kv[i] = (layer.keys[row:row + 1, :, t - length:].clone(), layer.values[row:row + 1, :, t - length:].clone())
    return CacheSnapshot(kv, conv, length)


def cache_from_snapshot(snap: CacheSnapshot, text_config, upto: int | None = None) -> DynamicCache:
    """A fresh batch-1 DynamicCache holding the snapshot's first ``upto`` tokens (default: all).

    Conv states carry no time axis, so they can only be restored at the snapshot's full length; callers that
    need a shorter prefix of a hybrid model must use a conv checkpoint taken at that length.
    """
    upto = snap.length if upto is None else upto
    assert upto == snap.length or not snap.conv, "a conv state is only valid at the exact length it was taken"
    cache = DynamicCache(config=text_config)
    for i, layer in enumerate(cache.layers):
        if _is_conv(layer):
            state = snap.conv[i].clone()
            layer.lazy_initialization(conv_states=state, conv_kernel_size=state.shape[-1])
            layer.conv_states[0].copy_(state)
            layer.has_previous_state[0] = True
        else:
            k, v = snap.kv[i]
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k[:, :, :upto].clone(), v[:, :, :upto].clone()
    return cache


def pad_left(cache, n: int) -> None:
    """Prepend ``n`` zero positions to every attention layer (masked out by the caller's attention mask)."""
    if n <= 0:
        return
    for layer in cache.layers:
        if not _is_conv(layer):
            b, h, _, d = layer.keys.shape
            layer.keys = torch.cat([layer.keys.new_zeros(b, h, n, d), layer.keys], dim=2)
            layer.values = torch.cat([layer.values.new_zeros(b, h, n, d), layer.values], dim=2)


def append_rows(cache, other) -> None:
    """Concatenate ``other``'s rows after ``cache``'s (both already padded to the same length)."""
    for layer, extra in zip(cache.layers, other.layers):
        if _is_conv(layer):
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
        if not _is_conv(layer):
            layer.keys = layer.keys[:, :, n:]
            layer.values = layer.values[:, :, n:]


@dataclass
class StepUndo:
    """What a failed forward may have changed in place: attention lengths and conv states (see ``rollback``)."""
    attn_len: dict[int, int]
    conv: dict[int, torch.Tensor]


def undo_point(cache) -> StepUndo:
    """Cheap record taken before a decode step: conv states are [B, hidden, L], a few KB per row."""
    attn, conv = {}, {}
    for i, layer in enumerate(cache.layers):
        if _is_conv(layer):
            conv[i] = layer.conv_states[0].clone()
        else:
            attn[i] = layer.keys.shape[-2]
    return StepUndo(attn, conv)


def rollback(cache, undo: StepUndo) -> None:
    """Undo a forward that failed half way (e.g. out of memory): layers it reached appended K/V or rewrote
    their conv state in place; the layers it did not reach are untouched."""
    for i, layer in enumerate(cache.layers):
        if _is_conv(layer):
            layer.conv_states[0].copy_(undo.conv[i])
        else:
            layer.keys = layer.keys[:, :, :undo.attn_len[i]]
            layer.values = layer.values[:, :, :undo.attn_len[i]]
