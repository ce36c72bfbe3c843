#!/usr/bin/env bash
# One prepared GPU check, at most 9 minutes in all: LFM2-VL-1.6B text shape (random init) in fp16.
# Part 1, the engine alone (bench.gpu_decode, under 290 s):
# Decode tokens/s at B=1, 16, 64: the static-shape step eager (static) and captured (cuda; --graphs adds off, eager
# over exact shapes, and cuda-shapefree, captured with the eager steps' attention kernels); B=1 as a share of the
# bandwidth limit, TTFT and follow-up TTFT, and token agreement between the modes (static and cuda must be
# identical). Output: a table and a RESULT {json} line.
# Part 2, the whole stack on this host (bench.gpu_stack, under 170 s): Redis (the embedded server when none runs), one
# worker on the GPU, the page, and clients looping image turns through the page's API on the other cores; end-to-end
# tokens/s over the engine alone, TTFT p50/p95 of image turns, and its own RESULT line.
# Part 3, the queue's Redis CPU a turn on this host (bench.queue_scale and bench.queue_floor, under 80 s, no GPU): a
# Redis of its own on the last core with the load on the others, as a deployment gives Redis a core; the steps part
# (the queue's scripts alone), the turns part at 48 and 200 tokens (one worker with the model-free stub engine at an
# H200's rate), and the floor a queue of only the durable writes costs on the same Redis. The build machines' VMs pay
# Redis 10-40 times a bare server's CPU per round trip, so the queue's "Redis CPU a 48-token turn" is read here.
# Usage: bash bench/gpu.sh [extra args for bench.gpu_decode]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
timeout 290 "$PY" -m bench.gpu_decode --device cuda --batches 1,16,64 --steps 64 --graphs static,cuda "$@" || true
status=0
timeout 170 "$PY" -m bench.gpu_stack --device cuda --rows 64 --clients 72 --tokens 48 --seconds 20 --warm-s 15 || status=$?
timeout 60 "$PY" -m bench.queue_scale --parts steps,turns --layouts own --tokens 48,200 --seconds 6 --base '' || true
timeout 20 "$PY" -m bench.queue_floor || true
exit "$status"  # the whole stack's failure is the check's
