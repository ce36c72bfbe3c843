#!/usr/bin/env bash
# Create or refresh .venv: the pinned requirements, then this project itself (editable, so `engine`, `worker`,
# `ui` and the owlet-worker / owlet-page / owlet-demo commands work from any directory). Re-installs only
# when requirements.txt, pyproject.toml or the checkout's location changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.owlet-install.sha256"
want="$(cat "$root/requirements.txt" "$root/pyproject.toml" <(echo "$root") | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "owlet: creating virtualenv in $venv" >&2
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "owlet: installing requirements (torch comes from the machine's local wheels; about a minute)" >&2
  "$venv/bin/pip" install -q --upgrade pip "setuptools>=64" >&2
  "$venv/bin/pip" install -q -r "$root/requirements.txt" >&2
  echo "owlet: installing the project (editable)" >&2
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >&2
  echo "$want" > "$stamp"
fi
