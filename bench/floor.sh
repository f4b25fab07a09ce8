#!/usr/bin/env bash
# The floor: sluice, nginx and HAProxy beside bare byte relays that do no HTTP work at
# all (bench/floor: over epoll, over io_uring, over io_uring with multishot receives),
# in bench/bench.py's interleaved rounds; for a new connection a request, the least
# pooling proxy over epoll instead (`epoll-pool`). What they cost is the least any proxy
# can cost on this machine for the same traffic; a target below it cannot be met by
# user-space work.
#   bench/floor.sh          (ROUNDS=3 DURATION=4; ONLY and TESTS may narrow it further)
# Needs what bench/run.sh needs; builds bench/floor in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --manifest-path bench/floor/Cargo.toml
export FLOOR="$PWD/bench/floor/target/release/sluice-floor"
export ONLY=${ONLY:-nginx,haproxy,sluice,floor-epoll,floor-uring,floor-multi}
export TESTS=${TESTS:-keepalive-13B,keepalive-64KiB,ws-echo-1KiB,new-connection}
exec bench/run.sh "$@"
