#!/usr/bin/env bash
# The public HTTP cache test suite (cache-tests.fyi, npm package `http-cache-tests`)
# against sluice: the suite's own server is the origin, sluice caches in front of it
# (as the suite's README describes for reverse proxies), and the results are
# classified by the suite's rules (bench/cache-tests/summary.mjs) beside the reverse
# proxies published in the same release's `results/` folder.
#
#   bench/cache-tests.sh            run, print the table, check the criteria
#   ID=freshness-none bench/cache-tests.sh    one test, with its requests shown
#   CACHE_TESTS_SRC=DIR bench/cache-tests.sh  a checkout of the suite's current source
#                                   (github.com/http-tests/cache-tests), its
#                                   dependencies installed (`npm install`)
#
# Without CACHE_TESTS_SRC, the npm release is installed once into $CACHE_TESTS_DIR
# (default ~/.cache/sluice/cache-tests). Needs node and npm (installed on Debian when
# missing). Writes bench/cache-tests/results.json and bench/cache-tests/failing.txt.
#
# Criteria (docs/cache.md): more passes than every proxy cache published with the
# version run, and at most 5 required failures — not counting, with the npm release,
# the tests listed in bench/cache-tests/rfc9111.txt, whose expectations that release
# states against RFC 9111 and the suite's current source reverses.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=0.4.5
suite_home=${CACHE_TESTS_DIR:-$HOME/.cache/sluice/cache-tests}
suite=${CACHE_TESTS_SRC:-$suite_home/node_modules/http-cache-tests}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "cache-tests: installing nodejs and npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ -z "${CACHE_TESTS_SRC:-}" ] && { [ ! -f "$suite/package.json" ] || ! grep -q "\"version\": \"$version\"" "$suite/package.json"; }; then
    mkdir -p "$suite_home"
    (cd "$suite_home" && npm install --silent --no-audit --no-fund "http-cache-tests@$version" >/dev/null)
fi

# The current source keeps its engine in test-engine/; the npm release at the top.
engine=.
[ -d "$suite/test-engine" ] && engine=test-engine
allowed=/dev/null
[ -z "${CACHE_TESTS_SRC:-}" ] && allowed=bench/cache-tests/rfc9111.txt

cargo build --locked -q
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
read -r front origin < <(/usr/bin/python3 -c '
import socket
held = [socket.socket() for _ in range(2)]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))')

# Compression off: the suite compares Vary exactly, and sluice adds Accept-Encoding
# to it where it may compress. Heuristic freshness on, as a cache at the edge would run.
cat >"$work/sluice.conf" <<CONF
listen 127.0.0.1:$front
global { admin off }
site * {
    cache {
        heuristic on
    }
    proxy 127.0.0.1:$origin {
        compress off
    }
}
CONF
(cd "$suite" && exec env npm_config_port=$origin npm_config_protocol=http \
    npm_config_pidfile="$work/origin.pid" setsid node "$engine/server/server.mjs" >"$work/origin.log" 2>&1) &
pids+=($!)
setsid "$root/target/debug/sluice" run -c "$work/sluice.conf" >"$work/sluice.log" 2>&1 &
pids+=($!)
for port in "$front" "$origin"; do
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
done

if [ -n "${ID:-}" ]; then
    cd "$suite"
    npm_config_base="http://127.0.0.1:$front" npm_package_config_id="$ID" node --no-warnings "$engine/cli.mjs"
    exit 0
fi
out=$root/bench/cache-tests
(cd "$suite" && npm_config_base="http://127.0.0.1:$front" npm_package_config_id= \
    timeout 600 node --no-warnings "$engine/cli.mjs") >"$out/results.json"
published=()
for f in "$suite"/results/*.json; do
    name=$(basename "$f" .json)
    case $name in nginx|squid|trafficserver|apache|varnish|nuster|haproxy|caddy) published+=("$name=$f") ;; esac
done
node "$out/summary.mjs" "$suite" --allow "$allowed" --list sluice "sluice=$out/results.json" "${published[@]}" \
    2>"$out/failing.txt" | tee "$work/table.txt" | expand -t 16
[ -s "$work/table.txt" ] || { cat "$out/failing.txt" >&2; exit 1; }
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").slice(1).map(l => l.split("\t"))
const sluice = rows.find(r => r[0] === "sluice")
const best = rows.filter(r => r[0] !== "sluice").reduce((a, r) => Math.max(a, +r[1]), 0)
const problems = []
if (+sluice[1] <= best) problems.push(`passes ${sluice[1]} not more than the best published proxy (${best})`)
if (+sluice[3] > 5) problems.push(`${sluice[3]} required failures counted (at most 5)`)
if (problems.length) { console.error("cache-tests: FAILED: " + problems.join("; ")); process.exit(1) }
console.log(`cache-tests: ok: ${sluice[1]} passes (best published proxy ${best}), ${sluice[2]} required failures (${sluice[3]} counted)`)
' "$work/table.txt"
