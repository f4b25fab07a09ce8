#!/usr/bin/env bash
# How sluice's throughput grows with `workers N`, with the proxy, the backend and the
# load generator on disjoint CPUs, so that neither the load side nor the backend is
# what limits the figure (on a 2-core machine they must share, which is why
# bench/run.sh's unpinned `workers 2 ÷ workers 1` cannot show scaling there).
#   bench/scaling.sh [path/to/sluice]      (default: target/dist/sluice, built here)
#   WORKERS="1 2 4 8" DURATION=10 ROUNDS=3 bench/scaling.sh
# Layout with W = the largest of WORKERS: sluice on CPUs 0..W-1 (for `workers N`, the
# first N of them), the nginx backend (W workers) and wrk (W threads, 64 connections
# each) on the CPUs after those. It needs at least 2W CPUs and refuses with fewer;
# 3W or more leaves the backend and wrk room of their own. Prints req/s for each N,
# the median over ROUNDS interleaved runs, and its ratio to `workers 1`; the
# target is at least 0.8 N.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-"1 2"}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
. bench/lib.sh
need_tools nginx:nginx wrk:wrk curl:curl taskset:util-linux
sluice_bin "${1:-}"
cpus=$(nproc)
max=0
for n in $WORKERS; do [ "$n" -gt "$max" ] && max=$n; done
if [ "$cpus" -lt $((2 * max)) ]; then
    echo "scaling: workers up to $max need at least $((2 * max)) CPUs (this machine has $cpus)" >&2
    exit 2
fi
proxy_cpus="0-$((max - 1))"
load_cpus="$max-$((cpus - 1))"
work=$(mktemp -d)
trap '[ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null; rm -rf "$work"' EXIT
bport=$(free_port)
cat >"$work/nginx.conf" <<NGX
daemon on; worker_processes $max; pid $work/nginx.pid; error_log $work/error.log;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$bport; keepalive_requests 1000000;
  location /small { return 200 "hello, world\n"; } } }
NGX
taskset -c "$load_cpus" nginx -c "$work/nginx.conf" -p "$work"
one() {
    local n=$1 port pid cpu_list rps
    port=$(free_port)
    printf 'global { workers %s; admin off; }\nlisten 127.0.0.1:%s\nsite * { proxy 127.0.0.1:%s }\n' "$n" "$port" "$bport" >"$work/sluice.conf"
    cpu_list="0-$((n - 1))"
    taskset -c "$cpu_list" "$bin" run -c "$work/sluice.conf" >"$work/sluice.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/small" && break; sleep 0.1; done
    rps=$(taskset -c "$load_cpus" wrk -t"$max" -c$((64 * max)) -d"${DURATION}s" "http://127.0.0.1:$port/small" |
        awk '/Requests\/sec/ {print $2}')
    kill -TERM "$pid"
    wait "$pid" || true
    echo "$rps"
}
declare -A got
for _ in $(seq "$ROUNDS"); do
    for n in $WORKERS; do
        got[$n]="${got[$n]:-} $(one "$n")"
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
base=$(echo "${got[1]:-}" | median)
echo "sluice on CPUs $proxy_cpus (the first N for workers N), nginx and wrk on $load_cpus; $ROUNDS rounds of ${DURATION}s"
for n in $WORKERS; do
    m=$(echo "${got[$n]}" | median)
    if [ -n "$base" ]; then
        echo "workers $n: $m req/s (median of${got[$n]}), $(awk -v a="$m" -v b="$base" -v n="$n" 'BEGIN {printf "%.2f x workers 1, target >= %.1f", a / b, 0.8 * n}')"
    else
        echo "workers $n: $m req/s (median of${got[$n]})"
    fi
done
