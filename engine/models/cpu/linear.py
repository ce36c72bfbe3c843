"""The text stack's fp32 matmuls on CPU: per matrix shape and row count, the fastest of four kernels, measured at
load on this machine (``cpu_kernels=auto``), or the kernels the operator names.

Every ``nn.Linear`` product in fp32 on CPU goes to MKL's ``sgemm`` by default. Three other kernels compute the same
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
- **Owlet's panel GEMM** (engine/models/cpu/panel_gemm.c, AVX2; a product split by panels over torch's threads) on a copy
  packed once, at load, into the layout its inner loop reads. On an AVX2-only AMD EPYC, where neither of the two
  above beats ``sgemm`` by more than 10 %, it took 3.4-4.3 ms for a 16-row product over the bench model's matrices
  against ``sgemm``'s 5.9-7.1; on the AVX-512 EPYC it is the fastest at decode row counts (3-16), oneDNN above.
  It costs a second copy of each matrix it is used for.

Which wins depends on the CPU: on an AVX2 AMD EPYC the packed product beat ``sgemm`` only at the full row count
and only on a matrix kept in cache (0.96-1.07x streamed from memory, as a decode step reads it; 0.6-0.9x padded
from 4 or 8 rows). So ``Calibration`` times the candidates at load, for each distinct matrix shape, at a long
product's row count (``LONG_ROWS``) and at each decode row count it probes, with the matrix streamed from memory
as in a forward pass; a kernel other than ``sgemm`` is used only where it beats ``sgemm`` by 5 %. A product of n
rows takes the kernel chosen for the smallest probed count >= n (the long one for more rows than that); one or
two rows are a matrix-vector product at memory speed and keep ``sgemm``.

The kernels round differently in the last bits, as any change of batch size already does (a 16-row ``sgemm`` row
is not bit-equal to a 1-row one). The engine's token-exactness tests run every kernel against the model's own
``nn.Linear``, which a routed module runs inside ``engine.models.reference_run.reference_run()``.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ...config import CPU_KERNELS
from ..reference_run import in_reference_run
from . import panel_gemm

SGEMM = "sgemm"  # torch's own product (nn.Linear)
PACKED, ONEDNN, PANEL = CPU_KERNELS  # the names the cpu_kernels setting takes
COPYING = (PACKED, PANEL)  # kernels that read a copy of each matrix, in the order they are given memory
MIN_FAST_ROWS = 3  # fewer rows: a matrix-vector product, memory bound whatever the kernel
# The most rows a pack is made for. A padded product costs what a full one does, and past 16 rows the re-packing
# that packing saves matters less: packed for 64 rows, a 16-row product took 127 ms against sgemm's 81, and
# packed for 32, a 4-row one 96 against 85 (the "small" bench matrices, one thread, AVX-512 Xeon). So a larger
# decode batch still gets 16-row packs for its small batches, and another kernel beyond 16 rows.
MAX_PACKED_ROWS = 16
# A long product (a prefill chunk: tens to hundreds of rows) is measured at this many rows.
LONG_ROWS = 128
log = logging.getLogger("owlet.engine")


def packed_available(dtype: torch.dtype) -> bool:
    """fp32, with torch's (private) MKL packing ops present: they are not a public API, so a torch without them
    simply runs unpacked."""
    return (dtype == torch.float32 and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and hasattr(torch.ops.mkl, "_mkl_linear"))


def onednn_available(dtype: torch.dtype) -> bool:
    """fp32, with torch built with oneDNN and its (private) linear op present."""
    return (dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def panel_available(dtype: torch.dtype) -> bool:
    """fp32, with Owlet's panel GEMM built for this CPU (AVX2 and FMA, a C compiler)."""
    return dtype == torch.float32 and panel_gemm.available()


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

    def forced(self, rows: int, packed: bool, onednn: bool, panel: bool = False) -> "KernelPlan":
        """This plan with kernels named outright: ``packed`` takes every product of 3..rows rows,
        ``panel`` every other product of 3 rows or more, and ``onednn`` what neither takes."""
        def pick(count: int, kernel: str) -> str:
            if packed and count <= rows:
                return PACKED
            if panel:
                return PANEL
            return ONEDNN if onednn else kernel
        return KernelPlan(tuple((count, pick(count, kernel)) for count, kernel in self.choices))


def sgemm_plan(rows: int) -> KernelPlan:
    """Every product through sgemm (what ``forced`` starts from when nothing is measured)."""
    return KernelPlan(((rows, SGEMM), (rows + 1, SGEMM)))


def _copy_for(kernel: str, weight: torch.Tensor, rows: int):
    """The copy of ``weight`` a copying kernel reads (a packed one for ``rows``-row products, for MKL)."""
    if kernel == PACKED:
        return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
    return panel_gemm.pack(weight)


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
    panels for the panel GEMM). One pass."""
    x = torch.randn(n, weights[0].shape[1])
    if kernel == PACKED:
        padded = torch.cat([x, x.new_zeros(rows - n, x.shape[1])]) if n < rows else x
        calls = [functools.partial(_packed_product, padded, p, w, bias, rows) for p, w in zip(copies, weights)]
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


# Matrices with fewer weights than this go through sgemm unmeasured (``route``). A product of one is a few thousand
# multiply-adds a row: on the AVX2 EPYC a 16-row product of a 489x64 matrix takes 29 us and a 64x64 one 9 us, of which
# the call itself is about 5 us, so the most a kernel could win there is microseconds a product, while measuring
# the candidates costs 0.2 to 0.3 s of CPU a shape at every engine start (about 2 s for a test model, all of whose
# matrices are this small). A real checkpoint's smallest text matrix has over 100,000 weights (Qwen2-0.5B's key
# projection), so no real checkpoint's plan changes; of the bundled demo model's six text shapes, 160x160 and 80x160
# go unmeasured.
SMALLEST_MEASURED = 32_768

# Passes per kernel and row count; the kernels take turns, pass by pass, so a drift in the machine's speed (other
# work on a shared host) touches them all alike, and each keeps its best pass.
_ROUNDS = 4


class Calibration:
    """``plan_for`` for ``use_kernels``: per distinct (out, in, bias) shape, the kernel that is fastest on this
    machine with its thread setting at ``LONG_ROWS`` rows and at each decode row count from ``rows`` down, among
    sgemm and the kernels allowed (``packed``: only up to ``rows``; ``onednn``; ``panel``), measured
    once with the matrix streamed from memory. ``time_product(kernel, weight_copies, kernel_copies, bias, rows, n)``
    is the clock (tests give their own; ``kernel_copies`` is None but for a copying kernel). A matrix of fewer than
    ``smallest_measured`` weights gets sgemm unmeasured (``SMALLEST_MEASURED``; its key goes in ``unmeasured``)."""

    def __init__(self, rows: int, packed: bool = True, onednn: bool = True,
                 time_product: Callable[..., float] | None = None, decode_only: tuple = (), panel: bool = False,
                 smallest_measured: int = 0):
        self.rows, self.smallest_measured = rows, smallest_measured
        self.unmeasured: set[tuple] = set()
        self.kernels = [k for k, allowed in ((PACKED, packed), (ONEDNN, onednn), (PANEL, panel)) if allowed]
        self._time = time_product or _time_product
        # Modules that never see more rows than a decode step (the LM head: prefill asks it for one row), so
        # their long products are not measured (the LM head is the largest matrix: seconds at load).
        self._decode_only = {id(m) for m in decode_only}
        self.by_shape: dict[tuple, KernelPlan] = {}

    def __call__(self, linear: torch.nn.Linear) -> KernelPlan:
        short = id(linear) in self._decode_only
        key = (linear.out_features, linear.in_features, linear.bias is not None) + (("decode only",) if short else ())
        if key not in self.by_shape:
            if linear.weight.numel() < self.smallest_measured:
                self.by_shape[key] = sgemm_plan(self.rows)
                self.unmeasured.add(key)
            else:
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


def _panel_product(x, panels, bias):
    return panel_gemm.product(x, panels, bias)


def _routed_forward(linear: torch.nn.Linear, plan: KernelPlan, copies: dict, rows: int,
                    x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or torch.is_grad_enabled() or in_reference_run():
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
    elif kernel == PANEL:
        out = _panel_product(flat.contiguous(), copies[PANEL], linear.bias)
    else:
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


_NEEDS = {PACKED: "MKL", ONEDNN: "oneDNN", PANEL: "AVX2, FMA and a C compiler"}


def route(modules: list[torch.nn.Module], rows: int, kernels: str, dtype: torch.dtype, room_bytes: int,
          decode_only: tuple = ()) -> int:
    """The ``cpu_kernels`` setting applied to ``modules``; returns the bytes the kernels' weight copies take.

    ``auto``: every kernel that can run here is a candidate, a copying one (packed, then the panel GEMM) only if a
    copy of every matrix fits in what is left of ``room_bytes``, and the candidates are measured (``Calibration``;
    ``decode_only``: linears that never see more than a decode step's rows). A comma list of kernel names: those,
    on every product they can take (``KernelPlan.forced``), unmeasured; one that cannot run here is refused."""
    named = kernels != "auto"
    wanted = [name.strip() for name in kernels.split(",")] if named else list(CPU_KERNELS)
    can = {PACKED: packed_available(dtype), ONEDNN: onednn_available(dtype), PANEL: panel_available(dtype)}
    panel_why = f" ({panel_gemm.unavailable_reason()})" if dtype == torch.float32 and not can[PANEL] else ""
    for kernel in wanted:
        if named and not can[kernel]:
            why = panel_why if kernel == PANEL else ""
            raise ValueError(f"cpu_kernels={kernels}: {kernel} needs float32 on a CPU with {_NEEDS[kernel]}; this "
                             f"engine runs {dtype}{why}")
    if not named and panel_why:
        log.info("panel GEMM not considered: %s", panel_gemm.unavailable_reason())
    use = {kernel: kernel in wanted and can[kernel] for kernel in CPU_KERNELS}
    room, size = room_bytes, sum(packable_bytes(m) for m in modules)
    for kernel, what in ((PACKED, "packing"), (PANEL, "packing panels of")):
        if not named and use[kernel] and size > room:
            log.info("not %s %.0f MB of text weights: with the other copies, more than a quarter of the available "
                     "memory", what, size / 2**20)
            use[kernel] = False
        elif use[kernel]:
            room -= size
    if not any(use.values()):
        return 0
    if named:
        def plan_for(linear):
            return sgemm_plan(rows).forced(rows, use[PACKED], use[ONEDNN], use[PANEL])
    else:
        plan_for = Calibration(rows, packed=use[PACKED], onednn=use[ONEDNN], panel=use[PANEL],
                               decode_only=decode_only, smallest_measured=SMALLEST_MEASURED)
    routed = [pair for m in modules for pair in use_kernels(m, rows, plan_for)]
    if not named:
        log.info("CPU linear calibration (fastest kernel by rows, per out x in matrix): %s",
                 "; ".join(f"{o}x{i}{' (decode only)' if rest[1:] else ''}: {plan.describe()}"
                           + (f" (unmeasured: under {SMALLEST_MEASURED:,} weights)"
                              if (o, i, *rest) in plan_for.unmeasured else "")
                           for (o, i, *rest), plan in plan_for.by_shape.items()))
    copies = sum(linear._owlet_copy_bytes for linear, _ in routed)
    log.info("text-stack matrices: %d through oneDNN, %d through the panel GEMM, %d packed for "
             "%d-row decode products (for some or all of their products); %.1f MB of weight copies",
             *(sum(plan.uses(k) for _, plan in routed) for k in (ONEDNN, PANEL, PACKED)), rows,
             copies / 2**20)
    return copies
