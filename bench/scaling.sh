#!/usr/bin/env bash
# How sluice's throughput grows with `workers N`, with the proxy, the backend and the
# load generator on disjoint CPUs, so that neither the load side nor the backend is
# what limits the figure (on a 2-core machine they must share, which is why
# bench/run.sh's unpinned `workers 2 ÷ workers 1` cannot show scaling there).
#   bench/scaling.sh [path/to/sluice]      (default: target/dist/sluice, built here)
#   WORKERS="1 2 4 8" DURATION=10 ROUNDS=3 bench/scaling.sh
# Layout with W = the largest of WORKERS, over the CPUs this process may use: sluice
# on the first W (for `workers N`, the first N of them), the nginx backend (W workers)
# and wrk (W threads, 64 connections each) on the ones after those. It needs at least 2W CPUs and refuses with fewer;
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
# The CPUs this process may use (affinity, cpusets), in order.
mapfile -t allowed < <(python3 -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')
cpus=${#allowed[@]}
max=0
for n in $WORKERS; do
    [ "$n" -ge 1 ] || { echo "scaling: WORKERS must be numbers from 1" >&2; exit 2; }
    [ "$n" -gt "$max" ] && max=$n
done
if [ "$cpus" -lt $((2 * max)) ]; then
    echo "scaling: workers up to $max need at least $((2 * max)) CPUs (this process may use $cpus)" >&2
    exit 2
fi
list() { local IFS=,; echo "${allowed[*]:$1:$2}"; }
proxy_cpus=$(list 0 "$max")
load_cpus=$(list "$max" $((cpus - max)))
NGINX_WORKERS=$max BACKEND_CPUS=$load_cpus start_backend
# start_backend's own cleanup, and the sluice a run may have left.
cleanup() {
    [ -f "$work/sluice.pid" ] && kill "$(cat "$work/sluice.pid")" 2>/dev/null
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# One run of `workers $1`: its req/s on stdout; a run that fails stops the script
# with sluice's log.
one() {
    local n=$1 port pid rps up=
    port=$(free_port)
    printf 'global { workers %s; admin off; }\nlisten 127.0.0.1:%s\nsite * { proxy 127.0.0.1:%s }\n' "$n" "$port" "$bport" >"$work/sluice.conf"
    taskset -c "$(list 0 "$n")" "$bin" run -c "$work/sluice.conf" >"$work/sluice.log" 2>&1 &
    pid=$!
    echo "$pid" >"$work/sluice.pid"
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/small" && { up=1; break; }
        sleep 0.1
    done
    [ -n "$up" ] && rps=$(taskset -c "$load_cpus" wrk -t"$max" -c$((64 * max)) -d"${DURATION}s" "http://127.0.0.1:$port/small" |
        awk '/Requests\/sec/ {print $2}') || true
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || true
    rm -f "$work/sluice.pid"
    if [ -z "${rps:-}" ]; then
        echo "scaling: the workers $n run gave no figure; sluice said:" >&2
        cat "$work/sluice.log" >&2
        return 1
    fi
    echo "$rps"
}
declare -A got
for _ in $(seq "$ROUNDS"); do
    for n in $WORKERS; do
        r=$(one "$n") || exit 1
        got[$n]="${got[$n]:-} $r"
    done
done
# The median (the lower middle one for an even count); empty for no figures.
median() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR + 1) / 2)]}'; }
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
