"""DecodeBatch: the running decode batch as the engine, the model runner and the session store see it.

A decode batch holds the requests that are generating, one row each, with their caches, and builds the inputs of
one decode step over all of them. Two implementations:

- ``DynamicBatch`` (engine/batch/dynamic_batch.py): rows in one left-padded transformers ``DynamicCache``, concatenated
  as rows join and cut as they leave. Any cache layer kind (full, sliding window, LFM2 conv) and per-row position
  deltas (Qwen-VL's M-RoPE).
- ``SlotBatch`` (engine/batch/slot_batch.py): K/V and conv states preallocated per row and written in place, with an
  optional static-shape step (CUDA graphs). Full-attention and conv layers with plain positions only.

The family row picks one (``Family.decode_batch`` in engine/models/families.py): the path each family was verified
token-exact on. ``EngineConfig.decode_cache`` can move any family to the dynamic path, never a dynamic family
to slots. Nothing outside these modules knows which one it holds.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch

from ..kv.kv_cache import CacheSnapshot


@runtime_checkable
class DecodeBatch(Protocol):
    requests: list  # the running requests; row i is requests[i]
    seq_lens: torch.Tensor | None  # [B] tokens in each row's cache (the last sampled token is not in it yet)
    last_tokens: torch.Tensor | None  # [B] each row's next input token
    cache: object  # the transformers Cache one step's forward reads and writes (``cache=``)
    max_len: int  # the most tokens (prompt + output) one row can hold
    static_step: Callable[["DecodeBatch"], torch.Tensor] | None  # a static-shape step (logits), or None: eager
    last_attended: int  # row-positions the last step's attention read: benchmarks report padding from it

    def __len__(self) -> int: ...

    def add(self, request, cache, length: int, last_token: int) -> None:
        """Take in a freshly prefilled (or resumed) batch-1 cache holding ``length`` tokens as a new last row;
        the row's next input is ``last_token``."""

    def filter(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (the requests list says the new row order)."""

    def step_inputs(self) -> dict:
        """The model's keyword arguments for one decode step over every row."""

    def advance(self, cache, next_tokens: list[int]) -> None:
        """Record a finished step: every row gained one cached token, and ``next_tokens`` are the next inputs."""

    def snapshot(self, request) -> CacheSnapshot:
        """A copy of ``request``'s row as a batch-1 snapshot (for the session store and time slicing)."""

    def undo_point(self) -> object:
        """What ``rollback`` needs to undo a step whose forward fails half way (out of memory)."""

    def rollback(self, undo) -> None:
        """Put back what a failed forward changed in place."""


def make_decode_batch(config, runner, max_model_len: int) -> DecodeBatch:
    """The decode batch for ``runner``'s family: the row's path, or the dynamic one when
    ``config.decode_cache`` asks for it. ``decode_cache='slots'`` on a family verified on the dynamic path is
    refused, and so are static decode steps (``decode_graphs``, ``decode_compile``) without slots."""
    family = runner.family
    if config.decode_cache == "slots" and family.decode_batch != "slots":
        raise ValueError(f"decode_cache='slots': {family.name} is verified on the dynamic decode batch only (its "
                         f"cache layers {list(family.cache_layers)}, {family.positions} positions or own runner "
                         f"need it); use 'auto'")
    if config.decode_cache == "dynamic" or family.decode_batch == "dynamic":
        if config.decode_graphs not in ("off", "auto") or config.decode_compile:
            raise ValueError("decode_graphs and decode_compile need the slot cache (decode_cache='slots' on a family "
                             "that runs on it)")
        from .dynamic_batch import DynamicBatch

        return DynamicBatch(runner.device, max_model_len)
    from .slot_batch import make_slot_batch

    return make_slot_batch(config, runner, max_model_len)
