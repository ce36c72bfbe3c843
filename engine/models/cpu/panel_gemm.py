"""Owlet's own fp32 GEMM for few rows (engine/models/cpu/panel_gemm.c), one more candidate kernel for the text stack's
products on CPU (engine/models/cpu/linear.py weighs it against MKL's and oneDNN's).

Why: a decode step multiplies a handful of rows (one per running answer) by every weight matrix. The BLAS kernels
re-pack each matrix into their own layout on every call, and at 16 rows that packing is a large share of the
product. This kernel reads a copy of each matrix packed once, at load, into the layout its inner loop streams
(panels of 24 output columns), with a software prefetch of the next panel. On the AVX2-only AMD EPYC (one thread,
the "small" bench model's text matrices streamed from memory) a 16-row product over all of them took 3.4-4.3 ms
against OpenBLAS's 4.5-5.2 and MKL ``sgemm``'s 5.9-7.1 (4 rows: 2.0-2.3 against 2.7-3.5 and 4.4-5.2); from about 64
rows up the three are within 10 % of each other. Each output sums its k in blocks of 256, in an order that does
not depend on the row count, so a row's result is the same whatever rows it is computed with; its error against
an fp64 product is sgemm's order (1e-6 on a 768-term sum).

The C source is compiled at first use with the system's C compiler (``cc``, about a second) into a per-user cache
folder, keyed by the source and flags, so later processes load it at once. Where the CPU lacks AVX2 and FMA, or no
compiler is found, or the build fails, ``available()`` is False and says why (``unavailable_reason``): the engine
then uses the other kernels.

Threads: the C code runs on the calling thread. Where torch runs several intra-op threads, a product is split by
panels (column ranges) over the caller and ``threads - 1`` helper threads of this module, which block while idle
(ctypes releases the GIL for the call, so the parts run at once). On the 2-core AVX2 EPYC with two threads a 16-row
product over the bench matrices took 3.5 ms against 4.5 on one thread and ``sgemm``'s 5.7 on two; at 150 rows
``sgemm`` on two threads stays ahead (17.8 against 19.7), which the calibration sees.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("panel_gemm.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")
# Fewer panels than this per thread are not split: a hand-off to a helper costs tens of microseconds.
MIN_PANELS_PER_THREAD = 4
log = logging.getLogger("owlet.engine")


@dataclass(frozen=True)
class PanelWeight:
    """An (out x in) weight packed for ``product``; keeps the shape it was packed from."""
    packed: torch.Tensor
    out_features: int
    in_features: int
    panels: int  # of 24 output columns: what a product is split by


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_folder() -> Path:
    """A folder only this user can write: a library loaded from a folder others can write to would run their code."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "owlet" / "kernels"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = base.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise OSError(f"{base} is owned by another user or writable by others")
    return base


_PRIVATE_FOLDER = "owlet-kernels-"  # the prefix of a build folder of one process, removed once the library is loaded


def _build(compiler: str) -> Path:
    """The compiled library: from the cache, else built into it (or, with no usable cache, into a private
    temporary folder, which ``_load`` removes once the library is mapped)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, version)).encode()).hexdigest()[:16]
    try:
        folder = _cache_folder()
    except OSError as e:
        log.info("building the panel GEMM without a cache (%s)", e)
        folder = Path(tempfile.mkdtemp(prefix=_PRIVATE_FOLDER))
    library = folder / f"panel_gemm-{key}.so"
    if library.exists():
        info = library.stat()
        if info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return library
    partial = folder / f".{library.name}.{os.getpid()}"
    result = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise OSError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
    partial.chmod(0o755)  # whatever the umask: a library others could rewrite is never loaded (above)
    partial.replace(library)  # atomic: a process loading the cache never sees half a file
    return library


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library, "") or (None, why it is unavailable)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"it is written for x86-64, this is {platform.machine()}"
    missing = {"avx2", "fma"} - _cpu_flags()
    if missing:
        return None, f"the CPU lacks {', '.join(sorted(missing))}"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc or gcc) on PATH"
    try:
        path = _build(compiler)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building it failed: {e}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"loading it failed: {e}"
    finally:
        if path.parent.name.startswith(_PRIVATE_FOLDER):
            shutil.rmtree(path.parent, ignore_errors=True)  # the mapping outlives the file
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.owlet_panel_floats.argtypes, lib.owlet_panel_floats.restype = [i64, i64], i64
    lib.owlet_panel_pack.argtypes, lib.owlet_panel_pack.restype = [ptr, i64, i64, ptr], None
    lib.owlet_panel_count.argtypes, lib.owlet_panel_count.restype = [i64], i64
    lib.owlet_panel_gemm.argtypes, lib.owlet_panel_gemm.restype = [ptr, i64, i64, ptr, i64, ptr, ptr, i64, i64], None
    return lib, ""


def available() -> bool:
    """Whether the kernel can run here (built, or loaded from the cache, on first call)."""
    return _load()[0] is not None


def unavailable_reason() -> str:
    return _load()[1]


def pack(weight: torch.Tensor) -> PanelWeight:
    """The packed copy of a 2-D fp32 (out x in) weight that ``product`` reads."""
    lib = _load()[0]
    w = weight.detach().to(torch.float32).contiguous()
    n, k = w.shape
    packed = torch.empty(lib.owlet_panel_floats(n, k), dtype=torch.float32)
    lib.owlet_panel_pack(w.data_ptr(), n, k, packed.data_ptr())
    return PanelWeight(packed, n, k, lib.owlet_panel_count(n))


def product(x: torch.Tensor, weight: PanelWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` for a 2-D fp32 ``x`` on CPU; the C code trusts its pointers, so shapes are checked here."""
    if x.dim() != 2 or x.shape[1] != weight.in_features or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"panel product: expected fp32 CPU rows of {weight.in_features}, got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    if bias is not None and (bias.shape != (weight.out_features,) or bias.dtype != torch.float32):
        raise ValueError(f"panel product: bias must be fp32 of shape ({weight.out_features},)")
    x = x.contiguous()
    bias = bias.detach().contiguous() if bias is not None else None
    out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    if weight.in_features == 0:  # an empty sum: the C loops would not write ``out``
        return out.zero_() if bias is None else out.copy_(bias.expand_as(out))
    if not x.shape[0]:
        return out
    lib = _load()[0]
    run = functools.partial(lib.owlet_panel_gemm, x.data_ptr(), x.shape[0], weight.in_features,
                            weight.packed.data_ptr(), weight.out_features,
                            bias.data_ptr() if bias is not None else None, out.data_ptr())
    parts = max(1, min(torch.get_num_threads(), weight.panels // MIN_PANELS_PER_THREAD))
    bounds = [weight.panels * i // parts for i in range(parts + 1)]
    helped = []
    if parts > 1:
        helpers = _helpers(parts - 1)
        helped = [helpers.submit(run, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    run(bounds[0], bounds[1])
    for part in helped:
        part.result()  # x, the weights and out stay referenced here until every part is done
    return out


_pool_lock = threading.Lock()
_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _forget_helpers_after_fork() -> None:
    """A forked child has none of the parent's threads: a pool inherited from it would never run a part."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers_after_fork)


def _helpers(count: int) -> concurrent.futures.ThreadPoolExecutor:
    """At least ``count`` helper threads, shared by every product in the process. A pool too small for a larger
    thread count is replaced, not shut down: a product on another thread may still be handing work to it."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] < count:
            _pool = (count, concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="owlet-panel"))
        return _pool[1]
