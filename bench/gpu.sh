#!/usr/bin/env bash
# One prepared GPU check, at most 8 minutes in all: LFM2-VL-1.6B text shape (random init) in fp16.
# Part 1, the engine alone (bench.gpu_decode, under 290 s):
# Decode tokens/s at B=1, 16, 64: the static-shape step eager (static) and captured (cuda; --graphs adds off, eager
# over exact shapes, and cuda-shapefree, captured with the eager steps' attention kernels); B=1 as a share of the
# bandwidth limit, TTFT and follow-up TTFT, and token agreement between the modes (static and cuda must be
# identical). Output: a table and a RESULT {json} line.
# Part 2, the whole stack on this host (bench.gpu_stack, under 170 s): Redis (the embedded server when none runs), one
# worker on the GPU, the page, and clients looping image turns through the page's API on the other cores; end-to-end
# tokens/s over the engine alone, TTFT p50/p95 of image turns, and its own RESULT line.
# Usage: bash bench/gpu.sh [extra args for bench.gpu_decode]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
timeout 290 "$PY" -m bench.gpu_decode --device cuda --batches 1,16,64 --steps 64 --graphs static,cuda "$@" || true
timeout 170 "$PY" -m bench.gpu_stack --device cuda --rows 64 --clients 72 --tokens 48 --seconds 20 --warm-s 15
