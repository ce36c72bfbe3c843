#!/usr/bin/env bash
# One prepared GPU check for issue 14, at most 8 minutes: LFM2-VL-1.6B text shape (random init) in fp16.
# Decode tokens/s at B=1, 16, 64: eager (off), the static-shape step eager (static), captured (cuda), and captured
# with the eager steps' attention kernels (cuda-shapefree: no cuDNN attention); B=1 as a share of the bandwidth
# limit, TTFT and follow-up TTFT, and token agreement between the modes (static and cuda must be identical). Output: bench/gpu.sh's stdout (table and
# a RESULT {json} line). Usage: bash bench/gpu.sh [extra args for bench.gpu_decode]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
timeout 470 "$PY" -m bench.gpu_decode --device cuda --batches 1,16,64 --steps 64 --graphs off,static,cuda,cuda-shapefree "$@"
