#!/usr/bin/env bash
# The soak: bench/soak.sh [MINUTES] (30 by default). Mixed load through sluice while
# the config reloads, backends die, one is slow, DNS answers move and Redis stops; see
# bench/soak.py for what runs and what must hold. Writes bench/soak-results.txt and
# docs/soak.png. Not part of CI's test run (it takes half an hour).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in h2load:nghttp2-client ab:apache2-utils redis-server:redis-server gnuplot:gnuplot-nox; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
/usr/bin/python3 -c 'import websockets' 2>/dev/null || missing+=(python3-websockets)
ls /usr/sbin/php-fpm* >/dev/null 2>&1 || missing+=(php-fpm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "soak: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if command -v service >/dev/null; then
    service redis-server stop >/dev/null 2>&1 || true
    for s in /etc/init.d/php*-fpm; do [ -x "$s" ] && "$s" stop >/dev/null 2>&1 || true; done
fi
cargo build --release --quiet
ulimit -n 65536 2>/dev/null || true
exec /usr/bin/python3 bench/soak.py "$@"
