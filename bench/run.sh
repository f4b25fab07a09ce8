#!/usr/bin/env bash
# sluice vs nginx vs HAProxy on this machine, side by side. One command:
#   bench/run.sh            (ROUNDS=3 DURATION=4 by default; both may be set)
# Installs what it needs on Debian (nginx, haproxy, wrk, nghttp2-client,
# python3-websockets), builds sluice
# in release mode, then runs bench/bench.py, which starts every process itself on
# loopback, pins them, and kills them all (by PID) on exit or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client taskset:util-linux python3:python3 openssl:openssl; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
done
/usr/bin/python3 -c 'import websockets' 2>/dev/null || missing+=(python3-websockets)
ls /usr/sbin/php-fpm* >/dev/null 2>&1 || missing+=(php-fpm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's packages may start system services; the bench starts its own.
if command -v service >/dev/null; then
    service nginx stop >/dev/null 2>&1 || true
    service haproxy stop >/dev/null 2>&1 || true
    for s in /etc/init.d/php*-fpm; do [ -x "$s" ] && "$s" stop >/dev/null 2>&1 || true; done
fi

cargo build --release --quiet
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec python3 bench/bench.py "$@"
