"""The text stack's fp32 matmuls on CPU: per matrix shape and row count, the fastest of five kernels, measured at
load on this machine.

Every ``nn.Linear`` product in fp32 on CPU goes to MKL's ``sgemm`` by default. Four other kernels compute the same
product (to rounding) faster on some CPUs and row counts:

- **MKL's packed GEMM** (``cblas_sgemm_compute`` on a copy packed once, at load). For few rows (a decode step's
  one row per running sequence), ``sgemm`` spends most of its time re-packing the weight matrix into its kernel's
  layout on every call; the packed copy skips that. Measured over the "small" bench model's matrices, one thread,
  an AVX-512 Xeon: a 16-row product took 54 ms instead of 77 (63 instead of 154 at 12 rows). MKL packs for one row
  count (``rows``: the decode batch size, at most ``MAX_PACKED_ROWS``); a product with fewer rows is zero-padded
  to ``rows`` (its real rows come out as they would alone: GEMM never mixes rows). At exactly ``rows`` rows the
  packed product is bit-identical to ``sgemm``. It costs a second copy of each matrix it is used for.
- **oneDNN's fp32 GEMM** (``torch.ops.mkldnn._linear_pointwise`` on the dense weight; no copy). On the AMD EPYC
  with AVX-512 it beat ``sgemm`` at every row count that matters, over the same matrices, one thread: 68-71 ms
  against 76-93 at 16 rows, 348-367 against 410-422 at 150 rows (a prefill chunk), 1,140 against 1,307-1,338 at
  512. Its rows do not depend on how many rows the product has (from 3 rows up), so a prompt prefilled in one
  chunk or several gets the same values.
- **OpenBLAS's GEMM** (numpy's BLAS, engine/openblas.py) on a transposed copy made once, at load. On an AVX2-only
  AMD EPYC, where neither of the two above beats ``sgemm`` by more than 10 %, it took 62 ms for a 16-row product
  over the same matrices against ``sgemm``'s 82 (293 against 314 at 128 rows). It costs a second copy of each
  matrix it is used for, and runs on as many threads as torch. Under ``auto`` it is a candidate only where torch
  runs one thread: with two, OpenBLAS's thread pool beside torch's made a whole engine slower (see ``route``).
- **Owlet's panel GEMM** (engine/panel_gemm.c, AVX2; a product split by panels over torch's threads) on a copy
  packed once, at load, into the layout its inner loop reads. On the AVX2-only EPYC it took 3.4-4.3 ms for a
  16-row product over the bench model's matrices against OpenBLAS's 4.5-5.2 and ``sgemm``'s 5.9-7.1. It costs a
  second copy of each matrix it is used for.

Which wins depends on the CPU: on an AVX2 AMD EPYC the packed product beat ``sgemm`` only at the full row count
and only on a matrix kept in cache (0.96-1.07x streamed from memory, as a decode step reads it; 0.6-0.9x padded
from 4 or 8 rows). So ``Calibration`` times the candidates at load, for each distinct matrix shape, at a long
product's row count (``LONG_ROWS``) and at each decode row count it probes, with the matrix streamed from memory
as in a forward pass; a kernel other than ``sgemm`` is used only where it beats ``sgemm`` by 5 %. A product of n
rows takes the kernel chosen for the smallest probed count >= n (the long one for more rows than that); one or
two rows are a matrix-vector product at memory speed and keep ``sgemm``.

The kernels round differently in the last bits, as any change of batch size already does (a 16-row ``sgemm`` row
is not bit-equal to a 1-row one). The engine's token-exactness tests run every kernel against the model's own
``nn.Linear`` (``unpacked()`` below).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from engine import openblas, panel_gemm

SGEMM, PACKED, ONEDNN, OPENBLAS, PANEL = "sgemm", "packed", "onednn", "openblas", "panel"
COPYING = (PACKED, PANEL, OPENBLAS)  # kernels that read a copy of each matrix, in the order they are given memory
MIN_FAST_ROWS = 3  # fewer rows: a matrix-vector product, memory bound whatever the kernel
# The most rows a pack is made for. A padded product costs what a full one does, and past 16 rows the re-packing
# that packing saves matters less: packed for 64 rows, a 16-row product took 127 ms against sgemm's 81, and
# packed for 32, a 4-row one 96 against 85 (the "small" bench matrices, one thread, AVX-512 Xeon). So a larger
# decode batch still gets 16-row packs for its small batches, and another kernel beyond 16 rows.
MAX_PACKED_ROWS = 16
# A long product (a prefill chunk: tens to hundreds of rows) is measured at this many rows.
LONG_ROWS = 128
_local = threading.local()
log = logging.getLogger("owlet.engine")


@contextlib.contextmanager
def unpacked():
    """Within this block, on this thread only, every product computes exactly as ``nn.Linear`` does, and every
    other kernel of the engine's (``reference_mode``) steps aside for the model's own code: for a reference run
    (``model.generate()``) on the engine's own model object while the engine keeps serving."""
    before = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = before


def reference_mode() -> bool:
    """Whether this thread is inside ``unpacked()``: the engine's own kernels (these products, the short-conv
    decode step of engine/short_conv.py) step aside for the model's code."""
    return getattr(_local, "off", False)


def packed_available(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, with torch's (private) MKL packing ops present: they are not a public API, so a torch
    without them simply runs unpacked."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and hasattr(torch.ops.mkl, "_mkl_linear"))


def onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, with torch built with oneDNN and its (private) linear op present."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def openblas_available(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, with numpy's BLAS an OpenBLAS whose threads can be set."""
    return device.type == "cpu" and dtype == torch.float32 and openblas.available()


def panel_available(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, with Owlet's panel GEMM built for this CPU (AVX2 and FMA, a C compiler)."""
    return device.type == "cpu" and dtype == torch.float32 and panel_gemm.available()


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules()
            if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def packable_bytes(module: torch.nn.Module) -> int:
    """Extra memory a packed copy of every matrix under ``module`` would take."""
    return sum(m.weight.numel() * m.weight.element_size() for m in _linears(module))


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel a product of n rows takes: ``choices`` maps probed row counts to kernels; n takes the choice of
    the smallest probed count >= n (the largest count's for more rows), fewer than MIN_FAST_ROWS take sgemm."""
    choices: tuple[tuple[int, str], ...]  # (rows, kernel), ascending rows

    def kernel_for(self, n: int) -> str:
        if n < MIN_FAST_ROWS:
            return SGEMM
        for rows, kernel in self.choices:
            if n <= rows:
                return kernel
        return self.choices[-1][1]

    def uses(self, kernel: str) -> bool:
        return any(k == kernel for _, k in self.choices)

    def describe(self) -> str:
        """e.g. ``4-8 packed, 9+ onednn`` (adjacent counts with one kernel merged; sgemm ranges left out)."""
        ranges: list[list] = []  # [low, high, kernel]
        low = MIN_FAST_ROWS
        for rows, kernel in self.choices:
            if ranges and ranges[-1][2] == kernel:
                ranges[-1][1] = rows
            else:
                ranges.append([low, rows, kernel])
            low = rows + 1
        ranges[-1][1] = None  # the last choice holds for any larger product
        parts = [f"{lo}+ {k}" if hi is None else f"{lo}-{hi} {k}" for lo, hi, k in ranges if k != SGEMM]
        return ", ".join(parts) or "sgemm"

    def forced(self, rows: int, packed: bool, onednn: bool, openblas: bool = False,
               panel: bool = False) -> "KernelPlan":
        """This plan with kernels asked for outright (``on``): ``packed`` takes every product of 3..rows rows,
        ``panel`` every other product of 3 rows or more, then ``openblas``, and ``onednn`` what none takes."""
        def pick(count: int, kernel: str) -> str:
            if packed and count <= rows:
                return PACKED
            if panel:
                return PANEL
            if openblas:
                return OPENBLAS
            return ONEDNN if onednn else kernel
        return KernelPlan(tuple((count, pick(count, kernel)) for count, kernel in self.choices))


def sgemm_plan(rows: int) -> KernelPlan:
    """Every product through sgemm (what ``forced`` starts from when nothing is measured)."""
    return KernelPlan(((rows, SGEMM), (rows + 1, SGEMM)))


def _copy_for(kernel: str, weight: torch.Tensor, rows: int):
    """The copy of ``weight`` a copying kernel reads (a packed one for ``rows``-row products, for MKL)."""
    if kernel == PACKED:
        return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
    if kernel == PANEL:
        return panel_gemm.pack(weight)
    return openblas.transposed(weight)


def use_kernels(module: torch.nn.Module, rows: int,
                plan_for: Callable[[torch.nn.Linear], KernelPlan]) -> list[tuple[torch.nn.Linear, KernelPlan]]:
    """Route the fp32 CPU ``nn.Linear``s under ``module`` through ``plan_for(linear)``; returns the modules whose
    plan uses a kernel other than sgemm, with their plans. A copying kernel's copy of a matrix is made only for
    modules whose plan uses it. The modules keep their weights (tied embeddings and the sgemm path read them)."""
    routed = []
    for linear in _linears(module):
        plan = plan_for(linear)
        if not any(plan.uses(k) for k in (ONEDNN, *COPYING)):
            continue
        with torch.no_grad():
            copies = {kernel: _copy_for(kernel, linear.weight, rows) for kernel in COPYING if plan.uses(kernel)}
        linear.forward = functools.partial(_routed_forward, linear, plan, copies, rows)
        linear._owlet_kernels = plan
        linear._owlet_packed_rows = rows if PACKED in copies else None
        linear._owlet_copy_bytes = linear.weight.numel() * linear.weight.element_size() * len(copies)
        routed.append((linear, plan))
    if any(plan.uses(OPENBLAS) for _, plan in routed):
        openblas.set_threads(torch.get_num_threads())
    return routed


# Decode row counts probed below ``rows`` (from the most down).
_PROBE_ROWS = (12, 8, 6, 4, 3)
# A kernel must beat sgemm by this margin to be used: measurement noise must not decide a tie.
_WIN_MARGIN = 0.95
# A forward pass reads each matrix once, from memory, not from cache: the calibration cycles through copies of a
# matrix that together exceed the last-level cache (on the AVX2 EPYC, packing won 1.2-1.3x at 16 rows on a
# matrix kept in cache and nothing on one streamed from memory, which is what the engine meets).
_STREAM_BYTES = 64 * 2**20


def _time_product(kernel: str, weights: list[torch.Tensor], copies: list[torch.Tensor] | None, bias, rows: int,
                  n: int) -> float:
    """Seconds an ``n``-row product takes per matrix through ``kernel``, over ``weights`` (copies of one matrix)
    in turn (``copies``: the kernel's own copies of them, for a copying kernel: packed ones padded to ``rows``,
    transposed ones for OpenBLAS, panels for the panel GEMM). One pass."""
    x = torch.randn(n, weights[0].shape[1])
    if kernel == PACKED:
        padded = torch.cat([x, x.new_zeros(rows - n, x.shape[1])]) if n < rows else x
        calls = [functools.partial(_packed_product, padded, p, w, bias, rows) for p, w in zip(copies, weights)]
    elif kernel == OPENBLAS:
        calls = [functools.partial(_openblas_product, x, t, bias) for t in copies]
    elif kernel == PANEL:
        calls = [functools.partial(_panel_product, x, p, bias) for p in copies]
    elif kernel == ONEDNN:
        calls = [functools.partial(_onednn_product, x, w, bias) for w in weights]
    else:
        calls = [functools.partial(torch.nn.functional.linear, x, w, bias) for w in weights]
    t = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - t) / len(calls)


# Passes per kernel and row count; the kernels take turns, pass by pass, so a drift in the machine's speed (other
# work on a shared host) touches them all alike, and each keeps its best pass.
_ROUNDS = 4


class Calibration:
    """``plan_for`` for ``use_kernels``: per distinct (out, in, bias) shape, the kernel that is fastest on this
    machine with its thread setting at ``LONG_ROWS`` rows and at each decode row count from ``rows`` down, among
    sgemm and the kernels allowed (``packed``: only up to ``rows``; ``onednn``; ``openblas``; ``panel``), measured
    once with the matrix streamed from memory. ``time_product(kernel, weight_copies, kernel_copies, bias, rows, n)``
    is the clock (tests give their own; ``kernel_copies`` is None but for a copying kernel)."""

    def __init__(self, rows: int, packed: bool = True, onednn: bool = True, openblas: bool = False,
                 time_product: Callable[..., float] | None = None, decode_only: tuple = (), panel: bool = False):
        self.rows = rows
        self.kernels = [k for k, allowed in ((PACKED, packed), (ONEDNN, onednn), (OPENBLAS, openblas),
                                             (PANEL, panel)) if allowed]
        self._time = time_product or _time_product
        # Modules that never see more rows than a decode step (the LM head: prefill asks it for one row), so
        # their long products are not measured (the LM head is the largest matrix: seconds at load).
        self._decode_only = {id(m) for m in decode_only}
        self.by_shape: dict[tuple, KernelPlan] = {}

    def __call__(self, linear: torch.nn.Linear) -> KernelPlan:
        short = id(linear) in self._decode_only
        key = (linear.out_features, linear.in_features, linear.bias is not None) + (("decode only",) if short else ())
        if key not in self.by_shape:
            self.by_shape[key] = self._measure(linear.weight.detach(), None if linear.bias is None
                                               else linear.bias.detach(), long=not short)
        return self.by_shape[key]

    def _measure(self, weight: torch.Tensor, bias, long: bool = True) -> KernelPlan:
        counts = sorted({r for r in _PROBE_ROWS if r < self.rows} | {self.rows}
                        | ({max(LONG_ROWS, self.rows + 1)} if long else set()))
        with torch.inference_mode():
            copies = min(64, -(-_STREAM_BYTES // (weight.numel() * weight.element_size())))
            weights = [weight] + [weight.clone() for _ in range(copies - 1)]
            made = {k: [_copy_for(k, w, self.rows) for w in weights] for k in self.kernels if k in COPYING}
            choices = []
            for n in counts:
                kernels = [SGEMM] + [k for k in self.kernels if not (k == PACKED and n > self.rows)]
                for k in kernels:  # once untimed: first-call costs (oneDNN's primitive cache) are not the kernel's
                    self._time(k, weights[:1], made[k][:1] if k in made else None, bias, self.rows, n)
                seconds = dict.fromkeys(kernels, float("inf"))
                for _ in range(_ROUNDS):
                    for k in kernels:
                        seconds[k] = min(seconds[k], self._time(k, weights, made.get(k), bias, self.rows, n))
                best = min(kernels[1:], key=seconds.get, default=SGEMM)
                choices.append((n, best if seconds.get(best, 0) < _WIN_MARGIN * seconds[SGEMM] else SGEMM))
        return KernelPlan(tuple(choices))


def _packed_product(x, packed, weight, bias, rows):
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _onednn_product(x, weight, bias):
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _openblas_product(x, weight_t, bias):
    return openblas.product(x, weight_t, bias)


def _panel_product(x, panels, bias):
    return panel_gemm.product(x, panels, bias)


def _routed_forward(linear: torch.nn.Linear, plan: KernelPlan, copies: dict, rows: int,
                    x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or torch.is_grad_enabled() or reference_mode():
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    kernel = plan.kernel_for(n)
    if kernel == PACKED and n <= rows:
        if n < rows:
            flat = torch.cat([flat, flat.new_zeros(rows - n, flat.shape[1])])
        out = _packed_product(flat.contiguous(), copies[PACKED], linear.weight, linear.bias, rows)[:n]
    elif kernel == ONEDNN:
        out = _onednn_product(flat.contiguous(), linear.weight, linear.bias)
    elif kernel == OPENBLAS:
        out = _openblas_product(flat.contiguous(), copies[OPENBLAS], linear.bias)
    elif kernel == PANEL:
        out = _panel_product(flat.contiguous(), copies[PANEL], linear.bias)
    else:
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def route(modules: list[torch.nn.Module], rows: int, packed_mode: str, onednn_mode: str, openblas_mode: str,
          device: torch.device, dtype: torch.dtype, room_bytes: int, decode_only: tuple = (),
          panel_mode: str = "auto") -> int:
    """The engine's settings applied to ``modules`` (``cpu_packed_weights``, ``cpu_onednn_linear``,
    ``cpu_openblas_linear`` and ``cpu_panel_linear``: auto, on or off); returns the bytes the kernels' weight copies
    take. ``on`` where a kernel cannot run is refused; under ``auto`` a copying kernel (packed, then the panel GEMM,
    then OpenBLAS) is a candidate only if a copy of every matrix fits in what is left of ``room_bytes``, and the
    candidates are measured (``Calibration``; ``decode_only``: linears that never see more than a decode step's
    rows)."""
    settings = {PACKED: ("cpu_packed_weights", packed_mode, packed_available(device, dtype), "MKL"),
                ONEDNN: ("cpu_onednn_linear", onednn_mode, onednn_available(device, dtype), "oneDNN"),
                OPENBLAS: ("cpu_openblas_linear", openblas_mode, openblas_available(device, dtype),
                           "numpy on OpenBLAS"),
                PANEL: ("cpu_panel_linear", panel_mode, panel_mode != "off" and panel_available(device, dtype),
                        "AVX2, FMA and a C compiler")}
    for name, mode, can, lib in settings.values():
        if mode == "on" and not can:
            why = f" ({panel_gemm.unavailable_reason()})" if name == "cpu_panel_linear" and dtype == torch.float32 \
                and device.type == "cpu" else ""
            raise ValueError(f"{name}=on needs float32 on a CPU with {lib}; this engine runs {dtype} on "
                             f"{device}{why}")
    if panel_mode == "auto" and not settings[PANEL][2] and device.type == "cpu" and dtype == torch.float32:
        log.info("panel GEMM not considered: %s", panel_gemm.unavailable_reason())
    use = {kernel: can and mode != "off" for kernel, (_, mode, can, _) in settings.items()}
    auto = {kernel: use[kernel] and settings[kernel][1] == "auto" for kernel in use}
    if auto[OPENBLAS] and torch.get_num_threads() > 1:
        # With two threads each, OpenBLAS's pool beside torch's OpenMP one made the engine slower than on sgemm
        # alone (AVX2 EPYC, 2 cores: a burst took 25.8 s against 23.3), though each product alone was faster.
        log.info("OpenBLAS not considered: torch runs %d threads, and OpenBLAS's own pool beside torch's is "
                 "measured only with one", torch.get_num_threads())
        use[OPENBLAS] = auto[OPENBLAS] = False
    room, size = room_bytes, sum(packable_bytes(m) for m in modules)
    for kernel, what in ((PACKED, "packing"), (PANEL, "packing panels of"), (OPENBLAS, "copying for OpenBLAS")):
        if auto[kernel] and size > room:
            log.info("not %s %.0f MB of text weights: with the other copies, more than a quarter of the available "
                     "memory", what, size / 2**20)
            use[kernel] = auto[kernel] = False
        elif use[kernel]:
            room -= size
    if not any(use.values()):
        return 0
    if use[OPENBLAS]:  # before the calibration times it: OpenBLAS starts on as many threads as there are cores
        openblas.set_threads(torch.get_num_threads())
    calibration = (Calibration(rows, packed=use[PACKED], onednn=use[ONEDNN], openblas=use[OPENBLAS],
                               panel=use[PANEL], decode_only=decode_only) if any(auto.values()) else None)
    forced = {kernel: use[kernel] and not auto[kernel] for kernel in use}

    def plan_for(linear):
        plan = calibration(linear) if calibration else sgemm_plan(rows)
        return plan.forced(rows, forced[PACKED], forced[ONEDNN], forced[OPENBLAS], forced[PANEL])
    routed = [pair for m in modules for pair in use_kernels(m, rows, plan_for)]
    if calibration is not None:
        log.info("CPU linear calibration (fastest kernel by rows, per out x in matrix): %s",
                 "; ".join(f"{o}x{i}{' (decode only)' if rest[1:] else ''}: {plan.describe()}"
                           for (o, i, *rest), plan in calibration.by_shape.items()))
    copies = sum(linear._owlet_copy_bytes for linear, _ in routed)
    log.info("text-stack matrices: %d through oneDNN, %d through OpenBLAS, %d through the panel GEMM, %d packed for "
             "%d-row decode products (for some or all of their products); %.1f MB of weight copies",
             *(sum(plan.uses(k) for _, plan in routed) for k in (ONEDNN, OPENBLAS, PANEL, PACKED)), rows,
             copies / 2**20)
    return copies
