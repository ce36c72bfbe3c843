"""One line naming the machine a benchmark ran on: CPU model, the SIMD flags that change its speed, cores,
threads, device, dtype and torch. The machine kind comes with different CPUs (AVX2 only, or AVX-512 with
native bf16), so no figure is quoted without this line."""
from __future__ import annotations

import os
import platform

# The flags that decide which kernels torch and oneDNN/MKL pick, and whether ``auto`` chooses bf16.
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def _cpuinfo_field(name: str) -> str | None:
    if not os.path.exists("/proc/cpuinfo"):
        return None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    return None


def cpu_description() -> str:
    """'AMD EPYC (avx2 fma avx512f avx512_bf16), 2 cores'."""
    name = _cpuinfo_field("model name") or platform.processor() or "unknown CPU"
    flags = set((_cpuinfo_field("flags") or "").split())
    present = " ".join(f for f in SPEED_FLAGS if f in flags) or "no AVX2"
    return f"{name} ({present}), {os.cpu_count()} cores"


def machine_line(device: str, dtype) -> str:
    import torch  # here, so the page bench's harness can name its CPU without loading torch

    if device.startswith("cuda"):
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{cpu_description()}, torch threads {torch.get_num_threads()}"
    kind = str(dtype).replace("torch.", "") if dtype is not None else "n/a"
    return f"machine: {where} | device {device} | dtype {kind} | torch {torch.__version__}"
