"""DynamicBatch: the decode batch over one left-padded transformers ``DynamicCache`` (a ``DecodeBatch``).

The path for every cache layer kind (full, sliding window, LFM2 conv) and for model-defined positions (M-RoPE):
the families whose row says ``decode_batch="dynamic"`` run on it (engine/models/families.py).

``add`` merges a freshly prefilled batch-1 cache; ``filter`` drops rows. Both keep three things consistent —
getting any of them wrong silently changes tokens:
- the 2D attention mask spans cache + new token, with zeros over each row's left padding;
- ``position_ids`` are each row's real length, not the padded length, plus the row's model-defined delta
  (M-RoPE models place text after an image at fewer positions than tokens; see ModelRunner.prepare_positions);
- merged LFM2 conv layers are flagged as having previous state (see kv_cache.append_rows).
"""
from __future__ import annotations

import torch

from ..kv import kv_cache


class DynamicBatch:
    static_step = None  # always eager: static shapes need the slot pool

    def __init__(self, device: torch.device, max_len: int):
        self.device = device
        self.max_len = max_len  # the concatenated cache grows as needed: the model's context is the only cap
        self._clear()

    def _clear(self) -> None:
        self.requests: list = []
        self.cache = None
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real token
        self.seq_lens: torch.Tensor | None = None  # [B] tokens in cache per row
        self.last_tokens: torch.Tensor | None = None  # [B] next input token per row
        self.pos_deltas: torch.Tensor | None = None  # [B] decode position minus cache length per row
        self.last_attended = 0

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def padded_len(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def add(self, request, cache, length: int, last_token: int) -> None:
        """Merge a batch-1 cache holding ``length`` tokens, whose next input is ``last_token``."""
        row_mask = torch.ones(1, length, dtype=torch.long, device=self.device)
        row = (torch.tensor([length], device=self.device), torch.tensor([last_token], device=self.device))
        delta = torch.tensor([request.scratch.position_delta], device=self.device)
        if self.cache is None:
            self.cache, self.mask = cache, row_mask
            self.seq_lens, self.last_tokens = row
            self.pos_deltas = delta
            self.requests = [request]
            return
        if length < self.padded_len:
            kv_cache.pad_left(cache, self.padded_len - length)
            row_mask = torch.cat([row_mask.new_zeros(1, self.padded_len - length), row_mask], dim=1)
        elif length > self.padded_len:
            kv_cache.pad_left(self.cache, length - self.padded_len)
            self.mask = torch.cat([self.mask.new_zeros(len(self), length - self.padded_len), self.mask], dim=1)
        kv_cache.append_rows(self.cache, cache)
        self.mask = torch.cat([self.mask, row_mask], dim=0)
        self.seq_lens = torch.cat([self.seq_lens, row[0]])
        self.last_tokens = torch.cat([self.last_tokens, row[1]])
        self.pos_deltas = torch.cat([self.pos_deltas, delta])
        self.requests.append(request)

    def filter(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` and cut left padding that no remaining row needs."""
        if len(keep) == len(self):
            return
        if not keep:
            self._clear()
            return
        idx = torch.tensor(keep, device=self.device)
        kv_cache.select_rows(self.cache, idx)
        self.mask, self.seq_lens, self.last_tokens = self.mask[idx], self.seq_lens[idx], self.last_tokens[idx]
        self.pos_deltas = self.pos_deltas[idx]
        self.requests = [self.requests[i] for i in keep]
        unused = self.padded_len - int(self.seq_lens.max())
        if unused > 0:
            kv_cache.trim_left(self.cache, unused)
            self.mask = self.mask[:, unused:]

    def step_inputs(self) -> dict:
        """Model kwargs for one decode step over every row."""
        ones = self.mask.new_ones(len(self), 1)
        self.last_attended = len(self) * (self.padded_len + 1)
        return dict(
            input_ids=self.last_tokens[:, None],
            attention_mask=torch.cat([self.mask, ones], dim=1),
            position_ids=(self.seq_lens + self.pos_deltas)[:, None],
            cache=self.cache,
            use_cache=True,
        )

    def advance(self, cache, next_tokens: list[int]) -> None:
        """Record a finished decode step: every row gained one cached token."""
        self.cache = cache
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self), 1)], dim=1)
        self.seq_lens = self.seq_lens + 1
        self.last_tokens = torch.tensor(next_tokens, device=self.device)

    def snapshot(self, request) -> kv_cache.CacheSnapshot:
        """``request``'s row as a batch-1 snapshot (its last ``seq_len`` positions)."""
        row = self.requests.index(request)
        return kv_cache.snapshot_row(self.cache, row, int(self.seq_lens[row]))

    def undo_point(self) -> kv_cache.StepUndo:
        return kv_cache.undo_point(self.cache)

    def rollback(self, undo: kv_cache.StepUndo) -> None:
        kv_cache.rollback(self.cache, undo)
