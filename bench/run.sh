#!/usr/bin/env bash
# sluice vs nginx vs HAProxy on this machine, side by side. One command:
#   bench/run.sh            (ROUNDS=3 DURATION=4 CONNS=64 by default; all may be set,
#                            CONNS=16,64,256 runs each scenario at each count)
#   PGO=1 bench/run.sh      (sluice built by bench/pgo.sh: profile-guided)
# Installs what it needs on Debian (nginx, haproxy, wrk, nghttp2-client,
# python3-websockets), builds sluice
# in release mode, then runs bench/bench.py, which starts every process itself on
# loopback, pins them, and kills them all (by PID) on exit or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/need.sh
need bench nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client taskset:util-linux python3:python3 openssl:openssl
cargo build --profile dist --quiet --bin sluice --example h3load --example grpcecho
# PGO=1: measure the profile-guided build (bench/pgo.sh, built first) as `sluice`.
if [ "${PGO:-}" = 1 ]; then
    bench/pgo.sh
    export SLUICE_BIN="target/pgo/$(rustc -vV | sed -n 's/^host: //p')/dist/sluice"
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec python3 bench/bench.py "$@"
