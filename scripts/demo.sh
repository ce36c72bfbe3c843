#!/usr/bin/env bash
# One-command local demo: creates the venv if needed, then runs its own Redis (or the one --redis-url names),
# a worker with the bundled model, and the chat page; prints the URL. Ctrl-C stops everything.
# Arguments go to owlet-demo (owlet/demo.py) (--host, --port, --share, --auth user:pass, --redis-url, --model).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/ensure_venv.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/owlet-demo "$@"
