#!/usr/bin/env bash
# User-space instructions per proxied request, under callgrind: the decisive figure for
# changes too small for wall-clock noise. Two runs (N1 and N2 requests of 13 bytes with
# `h2load --h1 -c 16` through sluice to an nginx backend) and their difference divided
# by N2 - N1, so start-up and shutdown cancel out. Repeatable to a few instructions.
#   bench/callgrind.sh [path/to/sluice]     (default: target/dist/sluice, built here)
#   SLUICE_GLOBAL="access_log /tmp/a.log" bench/callgrind.sh   (extra global options)
#   SLUICE_FILTERS="request_id; allow 127.0.0.0/8" bench/callgrind.sh   (filters before the proxy)
#   SLUICE_ADMIN=127.0.0.1:0 bench/callgrind.sh   (the admin API on: requests are metered)
#   SLUICE_PROXY="{ header_up X-A b }" bench/callgrind.sh   (the proxy's own block)
#   LOAD="-c 16 -m 1" bench/callgrind.sh   (h2load's options: an h2c front)
#   URL_PATH=big bench/callgrind.sh   (64 KiB responses: a step can leave 13 B alone and
#                                      cost a large body)
#   CG_OPTS="--cache-sim=yes" bench/callgrind.sh   (extra valgrind options; cache misses
#                                      go to CG_KEEP profiles)
#   TARGETS=FILE bench/callgrind.sh   (request targets, one a line, e.g. `small?t=…`,
#                                      taken in turn: requests that differ, like tokens)
#   NEW_CONN=1 bench/callgrind.sh   (`ab -c 16`: a new connection a request)
# Needs valgrind, nginx and h2load (nghttp2-client); installs them on Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${N1:-2000}
N2=${N2:-12000}
# The load: h1 over 16 connections; LOAD="-c 16 -m 1" measures an h2c front instead.
LOAD=${LOAD:---h1 -c 16}
. bench/lib.sh
need_tools valgrind:valgrind nginx:nginx h2load:nghttp2-client curl:curl ab:apache2-utils
sluice_bin "${1:-}"
start_backend
run() {
    local n=$1 port
    port=$(free_port)
    sluice_config "$port"
    valgrind --tool=callgrind ${CG_OPTS:-} --callgrind-out-file="$work/cg.$n" "$bin" run -c "$work/sluice.conf" 2>"$work/valgrind.$n" &
    local pid=$!
    wait_up "$port"
    drive "$n" "$port" "$work/load.$n"
    kill -TERM $pid
    wait $pid || true
    cg_total "$n"
}
cg_per_request ""
