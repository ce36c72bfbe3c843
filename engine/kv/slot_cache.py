"""SlotPool and SlotCache: the decode batch's K/V and LFM2 conv states, allocated once and written in place.

Every attention layer owns two buffers ``[slots, kv_heads, slot_len, head_dim]`` and every LFM2 conv layer one
``[slots, hidden, L]``, sized once from the memory budget. Decode row ``i`` lives in slot ``i``: rows are kept
compact (a finished row's slot is refilled by the last row), so the batch's view of a buffer is ``buf[:B]``, a
view with no copy. A row's tokens sit at positions ``0 .. len-1`` of its slot; there is no left padding.

One decode step writes each row's new K/V at its own position (``index_put_``) and hands the model's attention
``buf[:B, :, :T]`` with a ``[B, 1, 1, T]`` mask over the valid positions, T being the longest row + 1. Nothing is
concatenated, and the mask is built from the row lengths, not carried and grown. Conv layers get ``conv[:B]``,
which transformers' LFM2 decode kernel updates in place.

``SlotCache`` is a transformers ``Cache`` whose layers are these views; the model's own attention code calls
``cache.update`` as usual. It is only for decode (one new token per row): prefill runs on a per-request
``DynamicCache`` and ``copy_in`` moves the result into a slot.

Supported layer types: ``full_attention`` and ``conv``, with plain positions. A model with other layers (sliding
windows) or per-row position deltas (M-RoPE) runs on the ``DynamicBatch``: its family row says so
(engine/models/families.py), and the pool refuses layers it cannot hold.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionLayer

from .cache_layers import is_conv, kv_heads_and_dim, layer_types
from .kv_cache import CacheSnapshot

SUPPORTED_LAYER_TYPES = ("full_attention", "conv")


class SlotPool:
    """The preallocated buffers. Zero-filled once, so never-written positions are finite (masked, but a NaN
    times a zero attention weight would still be NaN)."""

    def __init__(self, text_config, num_slots: int, slot_len: int, device, dtype):
        self.num_slots, self.slot_len = num_slots, slot_len
        self.device = torch.device(device)
        self.types = layer_types(text_config)
        unsupported = sorted(set(self.types) - set(SUPPORTED_LAYER_TYPES))
        if unsupported:
            raise ValueError(f"the slot pool holds {' and '.join(SUPPORTED_LAYER_TYPES)} layers only; this model has "
                             f"{unsupported} layers: run it with decode_cache='dynamic'")
        heads, head_dim = kv_heads_and_dim(text_config)
        conv_len = getattr(text_config, "conv_L_cache", 3)
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.conv: dict[int, torch.Tensor] = {}
        for i, kind in enumerate(self.types):
            if kind == "conv":
                self.conv[i] = torch.zeros(num_slots, text_config.hidden_size, conv_len, device=device, dtype=dtype)
            else:
                self.keys[i] = torch.zeros(num_slots, heads, slot_len, head_dim, device=device, dtype=dtype)
                self.values[i] = torch.zeros_like(self.keys[i])

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for d in (self.keys, self.values, self.conv) for t in d.values())

    # -- moving rows in and out ---------------------------------------------------
    def copy_in(self, slot: int, cache, length: int) -> None:
        """Copy a batch-1 ``DynamicCache`` holding ``length`` tokens into ``slot``."""
        for i, layer in enumerate(cache.layers):
            if is_conv(layer):
                self.conv[i][slot].copy_(layer.conv_states[0][0])
            else:
                self.keys[i][slot, :, :length].copy_(layer.keys[0, :, -length:])
                self.values[i][slot, :, :length].copy_(layer.values[0, :, -length:])

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions (and conv states) into slot ``dst``."""
        for i in self.keys:
            self.keys[i][dst, :, :length].copy_(self.keys[i][src, :, :length])
            self.values[i][dst, :, :length].copy_(self.values[i][src, :, :length])
        for i in self.conv:
            self.conv[i][dst].copy_(self.conv[i][src])

    def snapshot(self, slot: int, length: int) -> CacheSnapshot:
        """Slot ``slot``'s first ``length`` tokens as a batch-1 snapshot (what the session store keeps)."""
        kv = {i: (self.keys[i][slot:slot + 1, :, :length].clone(), self.values[i][slot:slot + 1, :, :length].clone())
              for i in self.keys}
        conv = {i: c[slot:slot + 1].clone() for i, c in self.conv.items()}
        return CacheSnapshot(kv, conv, length)

    # -- step undo (a forward that fails half way rewrote conv states in place) ----------------------------
    def undo_point(self, rows: int) -> dict[int, torch.Tensor]:
        return {i: c[:rows].clone() for i, c in self.conv.items()}

    def rollback(self, undo: dict[int, torch.Tensor]) -> None:
        """K/V written at a row's next position are harmless (not yet counted, overwritten by the retry)."""
        for i, saved in undo.items():
            self.conv[i][:saved.shape[0]].copy_(saved)


class _SlotAttentionLayer(CacheLayerMixin):
    """One attention layer's view of the pool for the current step."""

    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, step: "SlotCache"):
        super().__init__()
        self.buf_keys, self.buf_values, self.step = keys, values, step
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers exist from the start
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        s = self.step
        assert key_states.shape[-2] == 1, "SlotCache is for decode: one new token per row"
        self.buf_keys.index_put_((s.rows, s.heads, s.write_at), key_states[:, :, 0])
        self.buf_values.index_put_((s.rows, s.heads, s.write_at), value_states[:, :, 0])
        return self.buf_keys[:s.batch, :, :s.kv_len], self.buf_values[:s.batch, :, :s.kv_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.step.kv_len, 0

    def get_seq_length(self) -> int:
        return self.step.kv_len - 1

    def get_max_length(self) -> int:
        return self.buf_keys.shape[2]


class SlotCache(Cache):
    """A transformers ``Cache`` over the pool's first ``batch`` slots, rebound before every decode step."""

    def __init__(self, pool: SlotPool):
        self.pool = pool
        self.batch = 0
        self.kv_len = 0
        layers = []
        for i, kind in enumerate(pool.types):
            if kind == "conv":
                layer = LinearAttentionLayer()
                layer.conv_kernel_size[0] = pool.conv[i].shape[-1]
                layer.is_conv_states_initialized[0] = True
                layer.has_previous_state[0] = True
                layer.device, layer.dtype = pool.conv[i].device, pool.conv[i].dtype
                layers.append(layer)
            else:
                layers.append(_SlotAttentionLayer(pool.keys[i], pool.values[i], self))
        super().__init__(layers=layers)
        device = next(iter({**pool.keys, **pool.conv}.values())).device
        heads = pool.keys[next(iter(pool.keys))].shape[1] if pool.keys else 1
        self._rows_all = torch.arange(pool.num_slots, device=device)
        self._heads = torch.arange(heads, device=device)

    def bind_static(self, rows: int, kv_len: int, write_at: torch.Tensor) -> None:
        """Point at slots ``0 .. rows-1`` with attention over ``kv_len`` positions (the longest row + 1, or a
        bucket's size); ``write_at`` [rows, 1] holds each row's write position (a static tensor when the step is a
        captured graph)."""
        self.batch, self.kv_len = rows, kv_len
        self.rows = self._rows_all[:rows, None]  # [B, 1] broadcasts against heads [1, H]
        self.heads = self._heads[None, :]
        self.write_at = write_at
        for i, layer in enumerate(self.layers):
            if isinstance(layer, LinearAttentionLayer):
                layer.conv_states[0] = self.pool.conv[i][:rows]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len - 1
