"""CPU-only kernels for the text stack's fp32 matmuls, behind one setting: ``EngineConfig.cpu_kernels``
(OWLET_CPU_KERNELS: ``auto``, ``off``, or a comma list of ``packed``, ``onednn``, ``panel``).

On a CPU most of a step is GEMMs, and torch's ``nn.Linear`` (MKL's ``sgemm``) re-packs each weight matrix into its
kernel's layout on every call: at a decode step's few rows that packing is a large share of the product. Three
kernels compute the same products faster on some CPU kinds (engine/models/cpu/linear.py says how, and what each is
worth where):

- ``packed``: MKL's packed GEMM on a copy packed once, at load, for decode row counts (won on the Intel Xeon);
- ``onednn``: oneDNN's GEMM on the weight itself (won on the AVX-512 AMD EPYCs, prefill chunks especially);
- ``panel``: Owlet's own AVX2 GEMM for few rows (panel_gemm.c, built at first use) on a copy packed once (won on
  the AVX2-only AMD EPYC, and at decode row counts on the AVX-512 one).

The engine reads and runs without this package: ``ModelRunner`` imports it only on a CPU device with
``cpu_kernels`` not ``off``, and then the modules keep the model's own code for everything else (other dtypes,
autograd, and reference runs: engine/models/reference_run.py). Nothing here runs on an accelerator.
"""
from __future__ import annotations

import torch

from .linear import MAX_PACKED_ROWS, route


def install(model: torch.nn.Module, kernels: str, max_running: int, dtype: torch.dtype) -> int:
    """Route ``model``'s text-stack matmuls (and its LM head) through the kernels ``kernels`` allows (the
    ``cpu_kernels`` setting, not ``off``); returns the bytes the kernels' weight copies take. The vision tower
    keeps ``nn.Linear``: it only runs long products, once per new image."""
    head = model.get_output_embeddings()  # prefill asks it for the last row only (logits_to_keep=1)
    modules = [m for m in (_text_stack(model), head) if m is not None]
    return route(modules, min(max_running, MAX_PACKED_ROWS), kernels, dtype,
                 room_bytes=_available_memory_bytes() // 4,
                 decode_only=(head,) if isinstance(head, torch.nn.Linear) else ())


def _text_stack(model: torch.nn.Module) -> torch.nn.Module:
    try:
        return model.get_decoder()
    except (AttributeError, ValueError, NotImplementedError):
        return model  # no separable decoder: route everything (long vision products keep sgemm anyway)


def _available_memory_bytes() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
