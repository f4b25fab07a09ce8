#!/usr/bin/env bash
# Runs fuzz targets for a while each and prints what they did.
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: 30 s, every target)
# FUZZ_JOBS=N runs N targets at once (default 1). Needs the nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`). New corpus entries go to fuzz/corpus/TARGET
# (not committed); seeds are fuzz/seeds/TARGET. A crash, leak or timeout leaves its input
# in fuzz/artifacts/TARGET and fails the run.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
    [ ${#targets[@]} -gt 0 ] || { echo "fuzz/run.sh: no targets (cargo fuzz list failed?)" >&2; exit 1; }
fi
cargo +nightly fuzz build >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

one() {
    local t=$1 log="$out/$1.log" result runs cov
    mkdir -p "corpus/$t"
    if cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -print_final_stats=1 >"$log" 2>&1; then
        result="no crash, no leak, no timeout"
    else
        result="FAILED (input in fuzz/artifacts/$t): $(grep -E "panicked|SUMMARY|ERROR|^Error" "$log" | head -3 | tr '\n' ' ' || true)"
    fi
    runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
    cov=$(grep -E "^#[0-9]+[[:space:]]+DONE" "$log" | grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" | tail -1 || true)
    echo "$t: ${secs} s, ${runs} executions, ${cov:-?}; $result" >"$out/$t.result"
}

running=0
for t in "${targets[@]}"; do
    one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "${FUZZ_JOBS:-1}" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait
failed=0
for t in "${targets[@]}"; do
    if [ -f "$out/$t.result" ]; then
        cat "$out/$t.result"
        grep -q FAILED "$out/$t.result" && failed=1
    else
        echo "$t: FAILED (no result; the run itself broke)"
        failed=1
    fi
done
exit $failed
