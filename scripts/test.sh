#!/usr/bin/env bash
# Run Owlet's test suite: creates the venv and installs the browser on first use, then pytest.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/ensure_venv.sh
bash scripts/ensure_test_tools.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two test processes side by side, each taking a whole file at a time (a file's tests share its servers and
# models); most of the suite waits on servers, browsers and workers, so two processes fit two cores.
# A -n given to this script wins: -n 0 runs every test in this one process (a debugger, -s).
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
