#!/usr/bin/env bash
# The soak: bench/soak.sh [MINUTES] (30 by default). Mixed load through sluice while
# the config reloads, backends die, one is slow, DNS answers move and Redis stops; see
# bench/soak.py for what runs and what must hold. Writes bench/soak-results.txt and
# docs/soak.png. Not part of CI's test run (it takes half an hour).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/need.sh
need soak h2load:nghttp2-client ab:apache2-utils redis-server:redis-server gnuplot:gnuplot-nox
cargo build --profile dist --quiet
ulimit -n 65536 2>/dev/null || true
exec /usr/bin/python3 bench/soak.py "$@"
