"""Prepacked fp32 weights for the text stack's matmuls on CPU (MKL's packed GEMM).

A decode step multiplies a few rows (one per running sequence) by every weight matrix of the text stack. For so
few rows, MKL's ordinary ``sgemm`` spends most of its time re-packing the weight matrix into its kernel's layout
on every call, which reads and writes the whole matrix once more than the product needs; at some row counts it
also picks a poor kernel (on an AVX-512 Xeon, 8 and 12 rows took longer than 16). Packing each matrix once, at
load, and calling ``cblas_sgemm_compute`` on it removes that: measured over the "small" bench model's matrices,
one thread, a 16-row product took 54 ms instead of 77 (and 63 instead of 154 at 12 rows).

MKL packs for one row count (``rows``: the decode batch size, at most ``MAX_PACKED_ROWS``). A product with fewer
rows, but at least ``MIN_PACKED_ROWS`` (or the calibrated minimum, below), is zero-padded to ``rows`` (its real
rows come out as they would alone: GEMM never mixes rows); a product with more rows (a prefill chunk) or with
fewer takes the ordinary path (one or two rows are a matrix-vector product at memory speed anyway). At exactly
``rows`` rows the packed product is bit-identical to ``torch.nn.functional.linear``; at other counts it may round
differently in the last bit, as any change of batch size may.

Whether it pays depends on the CPU. On an AVX2 AMD EPYC the packed product beat ``sgemm`` only at the full row
count, and only on a matrix kept in cache (1.2-1.3x at 16 rows; 0.96-1.07x streamed from memory, as a decode
step reads it), and padded from 4 or 8 rows it was slower (0.6-0.9x); packing everything measured 0.92-0.96x the
unpacked engine there (at that machine's noise of about 7 %, but never a gain). ``Calibration`` therefore
measures, at load and on this machine, from how many rows the padded packed product beats ``sgemm`` for each
distinct matrix shape; fewer rows take the ordinary path, and a shape where it never wins is not packed at all.

The packed copy costs as much memory as the matrices themselves; ``packable_bytes`` lets the caller decide.
Only fp32 on CPU, and only where torch was built with MKL.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Callable

import torch

MIN_PACKED_ROWS = 3
# The most rows a pack is made for. A padded product costs what a full one does, and past 16 rows the re-packing
# that packing saves matters less: packed for 64 rows, a 16-row product took 127 ms against sgemm's 81, and
# packed for 32, a 4-row one 96 against 85 (the "small" bench matrices, one thread, AVX-512 Xeon). So a larger
# decode batch still gets 16-row packs for its small batches, and sgemm beyond 16 rows.
MAX_PACKED_ROWS = 16
_local = threading.local()


@contextlib.contextmanager
def unpacked():
    """Within this block, on this thread only, packed modules compute exactly as ``nn.Linear`` does: for a
    reference run (``model.generate()``) on the engine's own model object while the engine keeps serving."""
    before = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = before


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, with torch's (private) MKL packing ops present: they are not a public API, so a torch
    without them simply runs unpacked."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and hasattr(torch.ops.mkl, "_mkl_linear"))


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules()
            if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def packable_bytes(module: torch.nn.Module) -> int:
    """Extra memory `pack_linears(module, ...)` would take."""
    return sum(m.weight.numel() * m.weight.element_size() for m in _linears(module))


def pack_linears(module: torch.nn.Module, rows: int,
                 min_rows_for: Callable[[torch.nn.Linear], int | None] | None = None) -> list[torch.nn.Linear]:
    """Give fp32 CPU ``nn.Linear``s under ``module`` a weight packed for ``rows``-row products; returns the
    modules packed. ``min_rows_for(linear)`` gives the fewest rows that take the packed product (default
    ``MIN_PACKED_ROWS``), or None to leave that module unpacked. The modules keep their weights (embeddings tied
    to them and longer products still read the original)."""
    packed_modules = []
    for linear in _linears(module):
        if getattr(linear, "_owlet_packed_rows", None) == rows:
            continue
        measured = MIN_PACKED_ROWS if min_rows_for is None else min_rows_for(linear)
        if measured is None:
            continue
        min_rows = max(measured, MIN_PACKED_ROWS)
        with torch.no_grad():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
        linear.forward = functools.partial(_packed_forward, linear, packed, rows, min_rows)
        linear._owlet_packed_rows = rows
        packed_modules.append(linear)
    return packed_modules


# Row counts tried by the calibration, from the most down: the packed product's cost does not depend on how
# many of its rows are real, sgemm's grows with them, so once the packed product loses it loses below too.
_PROBE_ROWS = (12, 8, 6, 4, 3)
# The packed product must beat sgemm by this margin to be used: measurement noise must not decide a tie.
_WIN_MARGIN = 0.95
# A decode step reads each matrix once, from memory, not from cache: the calibration cycles through copies of a
# matrix that together exceed the last-level cache (on the AVX2 EPYC, packing won 1.2-1.3x at 16 rows on a
# matrix kept in cache and nothing on one streamed from memory, which is what the engine meets).
_STREAM_BYTES = 64 * 2**20


def _time_product(packed: list[torch.Tensor] | None, weights: list[torch.Tensor], bias, rows: int,
                  n: int) -> float:
    """Seconds an ``n``-row product takes per matrix, over ``weights`` (copies of one matrix) in turn: through
    their ``packed`` copies (padded to ``rows``), or sgemm when ``packed`` is None. Best of 3 passes."""
    x = torch.randn(n, weights[0].shape[1])
    if packed is not None:
        padded = torch.cat([x, x.new_zeros(rows - n, x.shape[1])]) if n < rows else x
        calls = [functools.partial(torch.ops.mkl._mkl_linear, padded, p, w, bias, rows)
                 for p, w in zip(packed, weights)]
    else:
        calls = [functools.partial(torch.nn.functional.linear, x, w, bias) for w in weights]
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for call in calls:
            call()
        best = min(best, time.perf_counter() - t)
    return best / len(calls)


class Calibration:
    """``min_rows_for`` for ``pack_linears``: the fewest rows from which the packed product (padded to ``rows``)
    beats sgemm, measured once per distinct (out, in, bias) shape on this machine with its thread setting, the
    matrix streamed from memory as in a decode step; None where it does not win even at ``rows``.
    ``time_product(packed_copies_or_None, weight_copies, bias, rows, n)`` is the clock (tests give their own)."""

    def __init__(self, rows: int, time_product: Callable[..., float] | None = None):
        self.rows = rows
        self._time = time_product or _time_product
        self.by_shape: dict[tuple[int, int, bool], int | None] = {}

    def __call__(self, linear: torch.nn.Linear) -> int | None:
        key = (linear.out_features, linear.in_features, linear.bias is not None)
        if key not in self.by_shape:
            self.by_shape[key] = self._measure(linear.weight.detach(), None if linear.bias is None
                                               else linear.bias.detach())
        return self.by_shape[key]

    def _measure(self, weight: torch.Tensor, bias) -> int | None:
        least = None
        with torch.inference_mode():
            copies = min(64, -(-_STREAM_BYTES // (weight.numel() * weight.element_size())))
            weights = [weight] + [weight.clone() for _ in range(copies - 1)]
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, self.rows) for w in weights]
            for n in (self.rows,) + tuple(r for r in _PROBE_ROWS if r < self.rows):
                plain = self._time(None, weights, bias, self.rows, n)
                if self._time(packed, weights, bias, self.rows, n) >= _WIN_MARGIN * plain:
                    break
                least = n
        return least


def _packed_product(x, packed, weight, bias, rows):
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _packed_forward(linear: torch.nn.Linear, packed: torch.Tensor, rows: int, min_rows: int,
                    x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    if (not min_rows <= n <= rows or x.dtype != torch.float32 or torch.is_grad_enabled()
            or getattr(_local, "off", False)):
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    if n < rows:
        flat = torch.cat([flat, flat.new_zeros(rows - n, flat.shape[1])])
    out = _packed_product(flat.contiguous(), packed, linear.weight, linear.bias, rows)
    return out[:n].reshape(*x.shape[:-1], out.shape[-1])
