#!/usr/bin/env bash
# Create or refresh .venv: the pinned requirements, then this project itself (editable, so `engine`, `worker`,
# `ui` and the owlet-worker / owlet-page / owlet-demo commands work from any directory). Re-installs only
# when requirements.txt, pyproject.toml or the checkout's location changed. What pip says goes to
# .venv/owlet-install.log; the terminal gets one line, or the log's last lines if the install fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.owlet-install.sha256"
log="$venv/owlet-install.log"
want="$(cat "$root/requirements.txt" "$root/pyproject.toml" <(echo "$root") | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "owlet: creating virtualenv in $venv" >&2
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "owlet: installing the requirements and the project into .venv (the first time: 3.2 GB to download, 6.4 GB" \
       "installed, a few minutes; README \"Two commands\"); pip's output: $log" >&2
  if ! { "$venv/bin/pip" install --upgrade pip "setuptools>=64" \
         && "$venv/bin/pip" install -r "$root/requirements.txt" \
         && "$venv/bin/pip" install --no-deps --no-build-isolation -e "$root"; } > "$log" 2>&1; then
    echo "owlet: the install failed; the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
