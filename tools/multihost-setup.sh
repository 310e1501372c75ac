#!/usr/bin/env bash
# What tests/multihost needs from the machine, installed from Debian's packages:
# PostgreSQL's server (initdb, postgres), redis-server, iproute2 (ip netns) and
# util-linux (unshare). The test starts and stops its own private servers; this script
# leaves no service running (policy-rc.d keeps the packages' init scripts from
# starting theirs). Safe to run again: it installs only what is missing. Without root
# or apt, it says what is missing and exits 0: the tests then skip, saying why.
set -euo pipefail

missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
command -v redis-server >/dev/null || missing+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "multihost: missing ${missing[*]} (needs root and apt-get); the multi-host tests will be skipped"
  exit 0
fi

echo "multihost: installing ${missing[*]} from Debian's packages"
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod +x "$policy"
  made_policy=1
fi
cleanup() { if [ -n "$made_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
