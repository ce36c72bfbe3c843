"""StaticDecode: a decode step with static shapes over the slot pool, optionally captured as CUDA graphs.

The batch is padded up to a size bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, ...) and attention spans a bucketed
number of positions (a multiple of ``kv_block``), so each (rows, positions) pair always runs the same kernels on
the same buffers: the inputs live in static tensors, the cache is the pool (fixed addresses), and the mask is
computed on the device from the positions. Padding rows decode a dummy token at position 0 of the free slots
above the batch (rows are compact, so those slots hold nothing), and their logits are dropped.

``capture=True`` (CUDA only) records one graph per pair on first use and replays it afterwards; capture runs the
forward a few times, so the pool's conv states are saved before and put back after (K/V writes are idempotent:
the same token at the same position). ``capture=False`` runs the same static-shape code eagerly: that is the
path the CPU tests cover. Both are behind ``EngineConfig.decode_graphs`` (off | static | cuda), off by default
until a device run shows the captured step token-exact and faster.
"""
from __future__ import annotations

import torch

_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def size_buckets(max_rows: int) -> list[int]:
    return [b for b in _BUCKETS if b < max_rows] + [max_rows]


class StaticDecode:
    def __init__(self, model, pool, capture: bool, kv_block: int = 256):
        if capture and pool.device.type != "cuda":
            raise ValueError("decode_graphs='cuda' needs a CUDA device; use 'static' to test the path on CPU")
        self.model, self.pool, self.capture = model, pool, capture
        self.kv_block = kv_block
        self.buckets = size_buckets(pool.num_slots)
        self._static: dict[tuple[int, int], dict] = {}
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = self.captures = 0

    def shape_for(self, rows: int, longest: int) -> tuple[int, int]:
        """(padded rows, attended positions) for a batch of ``rows`` whose longest row has ``longest`` tokens."""
        padded = next(b for b in self.buckets if b >= rows)
        positions = min(self.pool.slot_len, -(-(longest + 1) // self.kv_block) * self.kv_block)
        return padded, positions

    def _inputs(self, key: tuple[int, int]) -> dict:
        if key not in self._static:
            rows, positions = key
            dev = self.pool.device
            self._static[key] = dict(
                ids=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                pos=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                mask=torch.zeros(rows, 1, 1, positions, dtype=torch.bool, device=dev),
                arange=torch.arange(positions, device=dev),
            )
        return self._static[key]

    def _forward(self, cache, s: dict) -> torch.Tensor:
        torch.le(s["arange"][None, :], s["pos"], out=s["mask"][:, 0, 0, :])  # valid: position <= own length
        out = self.model(input_ids=s["ids"], attention_mask=s["mask"], position_ids=s["pos"], cache=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    @torch.inference_mode()
    def __call__(self, batch) -> torch.Tensor:
        """Logits [B, vocab] for one decode step of ``batch`` (a SlotBatch); advances nothing."""
        rows = len(batch)
        key = self.shape_for(rows, int(batch.seq_lens.max()))
        s = self._inputs(key)
        s["ids"].zero_()
        s["pos"].zero_()
        s["ids"][:rows, 0].copy_(batch.last_tokens)
        s["pos"][:rows, 0].copy_(batch.seq_lens)
        cache = batch.cache
        cache.bind_static(key[0], key[1], s["pos"])
        if not self.capture:
            return self._forward(cache, s)[:rows]
        if key not in self._graphs:
            self._graphs[key] = self._record(cache, s, key[0])
        graph, logits = self._graphs[key]
        graph.replay()
        self.replays += 1
        return logits[:rows]

    def _record(self, cache, s: dict, padded_rows: int):
        saved = self.pool.undo_point(padded_rows)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(cache, s)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self._forward(cache, s)
        self.pool.rollback(saved)  # warm-up forwards advanced the conv states
        self.captures += 1
        return graph, logits
