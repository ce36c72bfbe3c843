#!/usr/bin/env bash
# Run Owlet's test suite: creates the venv and installs the browser on first use, then pytest.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/ensure_venv.sh
bash scripts/ensure_test_tools.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two pytest processes by default (pytest-xdist, `-n 2 --dist loadfile`: a whole file to one process, since a
# file's tests share their servers and models), one per core of a 2-core CI machine; the suite's times are in
# docs/benchmarks.md "The test suite". The files go out in the order they are collected, package by package
# (`--no-loadscope-reorder`; xdist's default orders them by their number of tests, which mixes the packages, so a
# process left a package's shared stack, a page and a worker, and started it again a dozen times). A caller who
# passes -n/--numprocesses or -p no:xdist gets exactly what they passed (`-n 0` or `-p no:xdist` runs one process);
# --dist alone keeps the two processes.
xdist=(-n 2 --dist loadfile --no-loadscope-reorder)
for arg in "$@"; do
  case "$arg" in
    -n*|--numprocesses|--numprocesses=*|no:xdist|-pno:xdist) xdist=(); break ;;
    --dist|--dist=*) xdist=(-n 2) ;;
  esac
done
exec .venv/bin/python -m pytest ${xdist[@]+"${xdist[@]}"} "$@"
