#!/usr/bin/env bash
# Runs fuzz targets for a while each and prints what they did.
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: 30 s, every target)
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). New corpus
# entries go to fuzz/corpus/TARGET (not committed); seeds are fuzz/seeds/TARGET. A crash
# leaves its input in fuzz/artifacts/TARGET and fails the run.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build >/dev/null
failed=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    if cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -print_final_stats=1 >"$log" 2>&1; then
        result="no crash, no leak, no timeout"
    else
        result="FAILED (see fuzz/artifacts/$t)"
        grep -E "panicked|SUMMARY|ERROR" "$log" | head -5 >&2 || true
        failed=1
    fi
    runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
    cov=$(grep -E "^#[0-9]+[[:space:]]+DONE" "$log" | grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" | tail -1 || true)
    echo "$t: ${secs} s, ${runs} executions, ${cov:-?}; $result"
    rm -f "$log"
done
exit $failed
