#!/usr/bin/env bash
# A profile-guided build of sluice: the binary to package.
#   bench/pgo.sh                      -> target/pgo/<host>/dist/sluice (the path is printed)
#   PGO_TRAIN="TESTS=keepalive-13B,h2c-front" bench/pgo.sh
#                                       (assignments for the training run, as bench.py takes)
#   LLVM_PROFDATA=/usr/bin/llvm-profdata-22 bench/pgo.sh
#                                       (an llvm-profdata of rustc's LLVM, without rustup)
#
# 1. builds sluice with counters in every branch (`-Cprofile-generate`, target/pgo-gen;
#    `--target` keeps build scripts and proc macros out of the profile);
# 2. trains it on the benchmark's own traffic: every scenario of bench/bench.py once,
#    at 16 and 256 connections (plain, with the benchmark's filters, and observed:
#    metrics and a JSON access log);
# 3. merges the counts with the `llvm-profdata` of rustc's own LLVM version (rustup's
#    `llvm-tools`; one of another version cannot read them);
# 4. builds the `dist` profile again with the counts (`-Cprofile-use`, target/pgo).
#
# Like bench/run.sh, it installs the benchmark's tools with apt-get when missing (nginx,
# haproxy, wrk, h2load, php-fpm, python3-websockets) and stops the system services those
# packages start. About 20 minutes on two cores: two fat-LTO builds and the training.
# What it buys is in docs/performance.md (sixteenth part).
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
if [ -n "${LLVM_PROFDATA:-}" ]; then
    profdata=$LLVM_PROFDATA
else
    profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
    if [ ! -x "$profdata" ]; then
        if ! command -v rustup >/dev/null; then
            echo "pgo: needs an llvm-profdata of LLVM $llvm (rustc's):" \
                "rustup component add llvm-tools, or LLVM_PROFDATA=path" >&2
            exit 1
        fi
        rustup component add llvm-tools
    fi
fi
if ! "$profdata" --version 2>/dev/null | grep -q "LLVM version $llvm\."; then
    echo "pgo: $profdata is not of LLVM $llvm, the version rustc builds with" >&2
    exit 1
fi
read -ra train <<<"${PGO_TRAIN:-}"

. bench/need.sh
need pgo nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client taskset:util-linux python3:python3 openssl:openssl
# The load generators bench.py runs are built as usual: only sluice is trained.
cargo build --locked --profile dist --quiet --example h3load --example grpcecho
raw="$PWD/target/pgo-raw"
rm -rf "$raw"
echo "pgo: building an instrumented sluice (target/pgo-gen)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$raw" \
    cargo build --locked --profile dist --quiet --bin sluice --target "$host" --target-dir target/pgo-gen
echo "pgo: training on bench/bench.py's scenarios (target/pgo-train.txt)"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
env SLUICE_BIN="target/pgo-gen/$host/dist/sluice" ONLY=sluice,sluice-filters,sluice-observed \
    ROUNDS=1 DURATION=2 CONNS=16,256 SCALING=0 "${train[@]}" \
    python3 bench/bench.py >target/pgo-train.txt 2>&1
# A sluice killed before it exits writes no counts (or half a file).
if grep -q "did not exit" target/pgo-train.txt; then
    grep "did not exit" target/pgo-train.txt >&2
    echo "pgo: a training run was killed; its counts are missing" >&2
    exit 1
fi
if ! ls "$raw"/*.profraw >/dev/null 2>&1; then
    echo "pgo: the training left no counts in $raw" >&2
    exit 1
fi
"$profdata" merge -o target/pgo.profdata "$raw"
echo "pgo: building with the counts (target/pgo)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$PWD/target/pgo.profdata" \
    cargo build --locked --profile dist --quiet --bin sluice --target "$host" --target-dir target/pgo
echo "pgo: target/pgo/$host/dist/sluice"
