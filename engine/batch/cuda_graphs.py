"""StaticDecode: a decode step with static shapes over the slot pool, optionally captured as CUDA graphs.

The batch is padded up to a size bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, ...) and attention spans a bucketed
number of positions (a multiple of ``kv_block``), so each (rows, positions) pair always runs the same kernels on
the same buffers: the inputs live in static tensors, the cache is the pool (fixed addresses), and the mask is
computed on the device from the positions. Padding rows decode a dummy token at position 0 of the free slots
above the batch (rows are compact, so those slots hold nothing), and their logits are dropped.

``capture=True`` (CUDA only) records one graph per pair on first use and replays it afterwards; capture runs the
forward a few times, so the pool's conv states are saved before and put back after (K/V writes are idempotent:
the same token at the same position). ``capture=False`` runs the same static-shape code eagerly: that is the
path the CPU tests cover. Both are behind ``EngineConfig.decode_graphs`` (auto | off | static | cuda; auto
captures on CUDA).

``compile=True`` (``EngineConfig.decode_compile``) runs the step's forward through ``torch.compile`` (inductor,
static shapes: one compilation per shape, at its first use), so the many small kernels of a decode step are fused
(norms, rotary, the gated MLP's elementwise work); with ``capture`` the compiled kernels are what the graph records.
It is off by default until a device measurement says it pays; on CPU it runs and is tested like the rest. A new
shape compiles at its first use, inside that step (seconds to minutes: warm the shapes up before serving).

Graphs share one memory pool: replays never overlap, and each graph's output (its logits) stays referenced, so
one graph's scratch memory can be another's. Long contexts meet many position buckets, so at most
``max_graphs`` graphs are kept, least recently replayed dropped first (a dropped shape is captured again on its
next use).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Attention kernels for the bucketed step: every SDPA kernel, cuDNN's included (torch picks by its own priority).
# Eager steps leave cuDNN out because it builds a plan per new shape (engine/models/model_runner.py SHAPE_FREE_SDPA);
# here each (rows, positions) shape recurs, so its plan is built once, before capture, and then only replayed.
BUCKETED_SDPA = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]

_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def size_buckets(max_rows: int) -> list[int]:
    return [b for b in _BUCKETS if b < max_rows] + [max_rows]


class StaticDecode:
    def __init__(self, model, pool, capture: bool, kv_block: int = 256, compile: bool = False):
        if capture and pool.device.type != "cuda":
            raise ValueError("decode_graphs='cuda' needs a CUDA device; use 'static' to test the path on CPU")
        self.model, self.pool, self.capture = model, pool, capture
        self.kv_block = kv_block
        self.buckets = size_buckets(pool.num_slots)
        self._static: OrderedDict[tuple[int, int], dict] = OrderedDict()  # least recently used first
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if capture else None
        self.max_graphs = 64  # shapes (and graphs) held at once
        self.compiled = compile
        self._run = _compiled(model, self.max_graphs) if compile else model  # the forward a step runs
        self.replays = self.captures = self.evictions = 0
        self.attention_backends = BUCKETED_SDPA  # bench/gpu_decode.py compares it with the eager steps' choice

    def shape_for(self, rows: int, longest: int) -> tuple[int, int]:
        """(padded rows, attended positions) for a batch of ``rows`` whose longest row has ``longest`` tokens."""
        padded = next(b for b in self.buckets if b >= rows)
        positions = min(self.pool.slot_len, -(-(longest + 1) // self.kv_block) * self.kv_block)
        return padded, positions

    def _inputs(self, key: tuple[int, int]) -> dict:
        """The static input tensors of shape ``key``; the least recently used shape (and its graph) goes first
        when ``max_graphs`` shapes are held."""
        if key not in self._static:
            while len(self._static) >= self.max_graphs:
                old, _ = self._static.popitem(last=False)
                self._graphs.pop(old, None)
                self.evictions += 1
            rows, positions = key
            dev = self.pool.device
            self._static[key] = dict(
                ids=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                pos=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                mask=torch.zeros(rows, 1, 1, positions, dtype=torch.bool, device=dev),
                arange=torch.arange(positions, device=dev),
            )
        self._static.move_to_end(key)
        return self._static[key]

    def _forward(self, cache, s: dict) -> torch.Tensor:
        torch.le(s["arange"][None, :], s["pos"], out=s["mask"][:, 0, 0, :])  # valid: position <= own length
        out = self._run(input_ids=s["ids"], attention_mask=s["mask"], position_ids=s["pos"], cache=cache,
                        use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    @torch.inference_mode()
    def __call__(self, batch) -> torch.Tensor:
        """Logits [B, vocab] for one decode step of ``batch`` (a SlotBatch); advances nothing."""
        if self.pool.device.type != "cuda":
            return self._step(batch)
        with sdpa_kernel(self.attention_backends):
            return self._step(batch)

    def _step(self, batch) -> torch.Tensor:
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
        with torch.cuda.graph(graph, pool=self._graph_pool):
            logits = self._forward(cache, s)
        self.pool.rollback(saved)  # warm-up forwards advanced the conv states
        self.captures += 1
        return graph, logits


def _compiled(model, shapes: int):
    """``model`` under ``torch.compile`` with static shapes. Every shape the step holds is compiled once, so the
    recompile limit is raised to the number of shapes it keeps (past torch's default it would silently run
    eagerly)."""
    import torch._dynamo

    limit = getattr(torch._dynamo.config, "recompile_limit", None)
    if limit is not None and limit < shapes:
        torch._dynamo.config.recompile_limit = shapes
    return torch.compile(model, dynamic=False)
