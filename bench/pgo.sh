#!/usr/bin/env bash
# A profile-guided build of sluice: the binary to package where speed matters.
#   bench/pgo.sh                 -> target/pgo/dist/sluice
#   PGO_TRAIN="..." bench/pgo.sh    (extra environment for the training run, e.g.
#                                    CONNS=16,256 or TESTS=keepalive-13B,h2c-front)
#
# 1. builds sluice with counters in every branch (`-Cprofile-generate`, target/pgo-gen);
# 2. trains it on the benchmark's own traffic: every scenario of bench/bench.py once
#    (plain, with filters, and observed: metrics and a JSON access log), so a feature
#    the benchmark measures is never laid out as cold code;
# 3. merges the counts with the `llvm-profdata` of rustc's own LLVM (rustup's
#    `llvm-tools`; a distribution's llvm-profdata of another version cannot read them);
# 4. builds the `dist` profile again with the counts (`-Cprofile-use`, target/pgo).
#
# What it buys is in docs/performance.md (sixteenth part): the same instructions, laid
# out so that a request's hot path runs from fewer cache lines. Needs what bench/run.sh
# needs, plus rustup. About 25 minutes on two cores (two fat-LTO builds).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/need.sh
need pgo nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client taskset:util-linux python3:python3 openssl:openssl
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    rustup component add llvm-tools
fi
raw="$PWD/target/pgo-raw"
rm -rf "$raw"
# The load generators bench.py runs are built as usual: only sluice is trained.
cargo build --locked --profile dist --quiet --example h3load --example grpcecho
echo "pgo: building an instrumented sluice (target/pgo-gen)"
RUSTFLAGS="-Cprofile-generate=$raw" \
    cargo build --locked --profile dist --quiet --bin sluice --target-dir target/pgo-gen
echo "pgo: training on bench/bench.py's scenarios"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# shellcheck disable=SC2086 # PGO_TRAIN is a list of assignments
env SLUICE_BIN=target/pgo-gen/dist/sluice ONLY=sluice,sluice-filters,sluice-observed \
    ROUNDS=1 DURATION=2 CONNS=16,256 SCALING=0 ${PGO_TRAIN:-} \
    python3 bench/bench.py >target/pgo-train.txt
if ! ls "$raw"/*.profraw >/dev/null 2>&1; then
    echo "pgo: the training left no profile in $raw (did sluice exit on SIGTERM?)" >&2
    exit 1
fi
"$profdata" merge -o target/pgo.profdata "$raw"
echo "pgo: building with the profile (target/pgo)"
RUSTFLAGS="-Cprofile-use=$PWD/target/pgo.profdata" \
    cargo build --locked --profile dist --quiet --bin sluice --target-dir target/pgo
echo "pgo: target/pgo/dist/sluice"
