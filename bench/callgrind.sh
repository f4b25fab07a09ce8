#!/usr/bin/env bash
# User-space instructions per proxied request, under callgrind: the decisive figure for
# changes too small for wall-clock noise. Two runs (N1 and N2 requests of 13 bytes with
# `h2load --h1 -c 16` through sluice to an nginx backend) and their difference divided
# by N2 - N1, so start-up and shutdown cancel out. Repeatable to a few instructions.
#   bench/callgrind.sh [path/to/sluice]     (default: target/release/sluice, built here)
#   SLUICE_GLOBAL="access_log /tmp/a.log" bench/callgrind.sh   (extra global options)
#   SLUICE_FILTERS="request_id; allow 127.0.0.0/8" bench/callgrind.sh   (filters before the proxy)
#   SLUICE_ADMIN=127.0.0.1:0 bench/callgrind.sh   (the admin API on: requests are metered)
# Needs valgrind, nginx and h2load (nghttp2-client); installs them on Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${N1:-2000}
N2=${N2:-12000}
missing=()
for tool in valgrind:valgrind nginx:nginx h2load:nghttp2-client; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
bin=${1:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet
    bin=target/release/sluice
fi
work=$(mktemp -d)
cleanup() {
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bport=$(free_port)
cat >"$work/nginx.conf" <<NGX
daemon on; worker_processes 1; pid $work/nginx.pid; error_log $work/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$bport; keepalive_requests 1000000;
  location /small { return 200 "hello, world\n"; } } }
NGX
nginx -c "$work/nginx.conf" -p "$work"
run() {
    local n=$1 port
    port=$(free_port)
    printf 'global { workers 1; admin %s; %s }\nlisten 127.0.0.1:%s\nsite * {\n%s\nproxy 127.0.0.1:%s }\n' "${SLUICE_ADMIN:-off}" "${SLUICE_GLOBAL:-}" "$port" "$(printf '%s' "${SLUICE_FILTERS:-}" | tr ';' '\n')" "$bport" >"$work/sluice.conf"
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.$n" "$bin" run -c "$work/sluice.conf" 2>"$work/valgrind.$n" &
    local pid=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/small" && break
        sleep 0.2
    done
    h2load --h1 -c 16 -n "$n" "http://127.0.0.1:$port/small" >"$work/h2load.$n"
    grep -q "succeeded, 0 errored" "$work/h2load.$n" || grep "requests:" "$work/h2load.$n" >&2
    kill -TERM $pid
    wait $pid || true
    if [ -n "${CG_KEEP:-}" ]; then cp "$work/cg.$n" "$CG_KEEP.$n"; fi
    grep -m1 '^summary:' "$work/cg.$n" | awk '{print $2}'
}
a=$(run "$N1")
b=$(run "$N2")
echo "instructions: $N1 requests $a, $N2 requests $b"
echo "per request: $(( (b - a) / (N2 - N1) ))"
