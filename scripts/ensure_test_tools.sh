#!/usr/bin/env bash
# Install the Debian tools the tests drive: Chromium (browser test, via Playwright); nginx (the `public` compose
# profile's proxy, run on the host) and openssl (its test certificate); Prometheus's promtool (the `monitoring`
# profile's configuration); and, where a docker CLI exists without compose, docker-compose (the `compose config`
# checks). Needs root and apt; otherwise it says what is missing and the affected tests skip (outside CI only:
# under CI a missing tool fails its test).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if command -v docker >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1 \
   && ! command -v docker-compose >/dev/null 2>&1; then
  need+=(docker-compose)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "owlet: installing ${need[*]} from Debian (once)" >&2
  # nginx and prometheus are services: the tests run them on their own ports, so their packages must not start
  # them (policy-rc.d, as in Docker images, tells the install scripts not to).
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
else
  echo "owlet: ${need[*]} not installed and no root apt here; the tests that need them will skip" >&2
fi
