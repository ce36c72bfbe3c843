#!/usr/bin/env bash
# Run Owlet's test suite: creates the venv and installs the browser on first use, then pytest.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/ensure_venv.sh
bash scripts/ensure_test_tools.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
