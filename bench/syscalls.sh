#!/usr/bin/env bash
# System calls per proxied request, by name: the kernel entries behind the CPU figures
# of bench/run.sh. sluice (workers 1) in front of an nginx backend under
# `strace -f -c`, N requests of 13 bytes with `h2load` (h1 over 16 connections unless
# LOAD says otherwise); the counts are divided by N (start-up adds a few hundred calls,
# so keep N large).
#   bench/syscalls.sh [path/to/sluice]      (default: target/dist/sluice, built here)
#   N=40000 LOAD="-c 16 -m 1" bench/syscalls.sh    (an h2c front)
#   URL_PATH=big bench/syscalls.sh    (64 KiB responses)
#   TLS=1 bench/syscalls.sh    (a TLS listener; LOAD="-c 16 -m 1" for h2 over TLS)
#   NEW_CONN=1 bench/syscalls.sh    (`ab -c 16`: a new connection a request)
# SLUICE_ADMIN, SLUICE_GLOBAL and SLUICE_FILTERS as for bench/callgrind.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-40000}
LOAD=${LOAD:---h1 -c 16}
. bench/lib.sh
need_tools strace:strace nginx:nginx h2load:nghttp2-client curl:curl ab:apache2-utils
sluice_bin "${1:-}"
start_backend
port=$(free_port)
sluice_config "$port"
"$bin" run -c "$work/sluice.conf" 2>"$work/sluice.err" &
pid=$!
wait_up "$port"
strace -f -c -o "$work/strace" -p "$pid" 2>/dev/null &
tracer=$!
sleep 1
drive "$N" "$port" "$work/load"
kill -INT $tracer
wait $tracer || true
kill -TERM $pid
wait $pid || true
# strace -c: "% time seconds usecs/call calls errors syscall"; the total row last.
awk -v n="$N" '
    $NF == "total" { printf "%-16s %6.2f per request\n", "all", $(NF-2) / n; next }
    NF >= 5 && $1 ~ /^[0-9.]+$/ && $4 / n >= 0.01 {
        errs = (NF == 6) ? $5 : 0
        printf "%-16s %6.2f per request (%.2f failed)\n", $NF, $4 / n, errs / n
    }' "$work/strace"
