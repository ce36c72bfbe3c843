"""OpenBLAS's fp32 GEMM, reached through numpy, as one more candidate kernel for the text stack's matmuls on CPU
(engine/cpu_linear.py weighs it against MKL's).

Why: on an AVX2-only AMD EPYC (2 cores, one thread, the "small" bench model's text matrices streamed from memory)
MKL's ``sgemm`` took 82 ms for a 16-row product over all of them, OpenBLAS 62 ms (12 rows: 85 against 51; 128
rows: 314 against 293), with the weight stored transposed (in x out, contiguous), the layout OpenBLAS was fastest
on (the weight as nn.Linear holds it, out x in: 78 ms). PyPI's numpy wheels carry OpenBLAS (``scipy-openblas``), so this needs nothing installed; a numpy built
on another BLAS simply does not offer the kernel (``available()``).

OpenBLAS keeps its own thread pool beside torch's OpenMP one. The engine sets it to torch's intra-op thread count
when it routes a product here, so both libraries use the cores the operator gave torch and no more; the engine
considers this kernel on its own only where that is one thread (engine/cpu_linear.py says why).
"""
from __future__ import annotations

import ctypes
import functools

import numpy  # transformers needs it too; importing it loads its BLAS
import torch

# The thread-count setter under the names OpenBLAS builds export it (numpy's scipy-openblas prefixes its symbols).
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = tuple(name.replace("set_", "get_") for name in _SETTERS)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """numpy's OpenBLAS, if numpy's BLAS is OpenBLAS and the process has it loaded (importing numpy loads it)."""
    try:
        with open("/proc/self/maps") as maps:  # the mapped files: numpy's BLAS is among them (imported above)
            paths = {fields[-1] for fields in map(str.split, maps) if len(fields) >= 6}
    except OSError:
        return None
    for path in sorted(p for p in paths if p.startswith("/") and _is_openblas(p.rsplit("/", 1)[-1])):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if any(hasattr(lib, name) for name in _SETTERS):
            return lib
    return None


def _is_openblas(filename: str) -> bool:
    return "openblas" in filename.lower() and ".so" in filename


def available() -> bool:
    """Whether numpy runs its float32 products on an OpenBLAS whose thread count can be set."""
    return _library() is not None


def set_threads(count: int) -> None:
    """OpenBLAS's threads for every product after this (process-wide)."""
    lib = _library()
    setter = next(getattr(lib, name) for name in _SETTERS if hasattr(lib, name))
    setter(ctypes.c_int(max(1, count)))


def threads() -> int | None:
    """OpenBLAS's thread count now (None if this build does not say)."""
    lib = _library()
    getter = next((getattr(lib, name) for name in _GETTERS if hasattr(lib, name)), None)
    return int(getter()) if getter else None


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """The copy of an (out x in) weight that ``product`` reads: (in x out), contiguous."""
    return weight.detach().t().contiguous()


def product(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight_t + bias`` for a contiguous 2-D fp32 ``x``, computed by OpenBLAS into a torch tensor."""
    out = torch.empty(x.shape[0], weight_t.shape[1], dtype=x.dtype)
    numpy.matmul(x.numpy(), weight_t.numpy(), out=out.numpy())
    if bias is not None:
        out.add_(bias)
    return out
