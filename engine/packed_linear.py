"""Prepacked fp32 weights for the text stack's matmuls on CPU (MKL's packed GEMM).

A decode step multiplies a few rows (one per running sequence) by every weight matrix of the text stack. For so
few rows, MKL's ordinary ``sgemm`` spends most of its time re-packing the weight matrix into its kernel's layout
on every call, which reads and writes the whole matrix once more than the product needs; at some row counts it
also picks a poor kernel (on an AVX-512 Xeon, 8 and 12 rows took longer than 16). Packing each matrix once, at
load, and calling ``cblas_sgemm_compute`` on it removes that: measured over the "small" bench model's matrices,
one thread, a 16-row product took 54 ms instead of 77 (and 63 instead of 154 at 12 rows).

MKL packs for one row count (``rows``: the decode batch size, at most ``MAX_PACKED_ROWS``). A product with fewer
rows, but at least ``MIN_PACKED_ROWS``, is zero-padded to ``rows`` (its real rows come out as they would alone: GEMM
never mixes rows); a product with more rows (a prefill chunk) or with one or two rows (where ``sgemm`` is already a
matrix-vector product at memory speed) takes the ordinary path. At exactly ``rows`` rows the packed product is
bit-identical to ``torch.nn.functional.linear``; at other counts it may round differently in the last bit, as
any change of batch size may.

The packed copy costs as much memory as the matrices themselves; ``packable_bytes`` lets the caller decide.
Only fp32 on CPU, and only where torch was built with MKL.
"""
from __future__ import annotations

import contextlib
import functools
import threading

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


def pack_linears(module: torch.nn.Module, rows: int) -> int:
    """Give every fp32 CPU ``nn.Linear`` under ``module`` a weight packed for ``rows``-row products; returns
    how many were packed. The modules keep their weights (embeddings tied to them and longer products still
    read the original)."""
    count = 0
    for linear in _linears(module):
        if getattr(linear, "_owlet_packed_rows", None) == rows:
            continue
        with torch.no_grad():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
        linear.forward = functools.partial(_packed_forward, linear, packed, rows)
        linear._owlet_packed_rows = rows
        count += 1
    return count


def _packed_product(x, packed, weight, bias, rows):
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _packed_forward(linear: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    if (not MIN_PACKED_ROWS <= n <= rows or x.dtype != torch.float32 or torch.is_grad_enabled()
            or getattr(_local, "off", False)):
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    if n < rows:
        flat = torch.cat([flat, flat.new_zeros(rows - n, flat.shape[1])])
    out = _packed_product(flat.contiguous(), packed, linear.weight, linear.bias, rows)
    return out[:n].reshape(*x.shape[:-1], out.shape[-1])
