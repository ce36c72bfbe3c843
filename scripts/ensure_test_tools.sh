#!/usr/bin/env bash
# Install the Debian tools the tests drive: Chromium (browser test, via Playwright) and, where a docker CLI
# exists without compose, docker-compose (the `compose config` check). Needs root and apt; otherwise it
# says what is missing and the affected tests skip.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if command -v docker >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1 \
   && ! command -v docker-compose >/dev/null 2>&1; then
  need+=(docker-compose)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "owlet: installing ${need[*]} from Debian (once)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "owlet: ${need[*]} not installed and no root apt here; the tests that need them will skip" >&2
fi
