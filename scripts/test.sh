#!/usr/bin/env bash
# Run Owlet's test suite: creates the venv and installs the browser on first use, then pytest.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/ensure_venv.sh
bash scripts/ensure_test_tools.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One process by default. `-n 2 --dist loadfile` runs two side by side (pytest-xdist, a whole file each at a time):
# 16 min 44 s against about 20 on the 2-core VM, but a browser test's streaming check is less steady there, so it is
# not the default yet (docs/benchmarks.md "The test suite").
exec .venv/bin/python -m pytest "$@"
