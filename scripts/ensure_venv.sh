#!/usr/bin/env bash
# Create or refresh .venv from requirements.txt. Re-installs only when requirements.txt changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "owlet: creating virtualenv in $venv" >&2
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "owlet: installing requirements (torch comes from the machine's local wheels; about a minute)" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q -r "$root/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
