#!/usr/bin/env bash
# nginx's or HAProxy's user-space instructions a proxied request, on bench/callgrind.sh's
# load and backend: the same two runs (N1 and N2 requests of 13 bytes) and their
# difference, so sluice's figure has its peers' beside it.
#   bench/callgrind-peer.sh nginx|haproxy
#   LOAD="-c 16 -m 1" bench/callgrind-peer.sh haproxy   (an h2c front)
#   NEW_CONN=1 bench/callgrind-peer.sh nginx   (`ab -c 16`: a new connection a request)
#   CG_OPTS="--cache-sim=yes" CG_KEEP=/tmp/ngx bench/callgrind-peer.sh nginx
#                                    (simulated cache misses, kept as /tmp/ngx.N1, .N2)
# nginx runs one process (`master_process off`), HAProxy one thread, each with kept
# backend connections, as bench/bench.py runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
who=${1:?usage: bench/callgrind-peer.sh nginx|haproxy}
N1=${N1:-2000}
N2=${N2:-12000}
LOAD=${LOAD:---h1 -c 16}
h2c=""
case " $LOAD " in *" --h1 "*) ;; *) h2c=1 ;; esac
. bench/lib.sh
need_tools valgrind:valgrind nginx:nginx haproxy:haproxy h2load:nghttp2-client curl:curl ab:apache2-utils
start_backend
# Writes the peer's config for PORT and sets `cmd` to its command line.
peer_config() {
    local port=$1
    if [ "$who" = nginx ]; then
        mkdir -p "$work/px"
        cat >"$work/px.conf" <<NGX
master_process off; daemon off; worker_processes 1; pid $work/px.pid; error_log $work/px.err;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
  client_body_temp_path $work/px; proxy_temp_path $work/px;
  upstream b { server 127.0.0.1:$bport; keepalive 1024; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$port${h2c:+ http2};
    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NGX
        cmd=(nginx -p "$work" -c "$work/px.conf")
    else
        cat >"$work/px.cfg" <<HAP
global
    nbthread 1
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    http-reuse always
frontend f1
    bind 127.0.0.1:$port${h2c:+ proto h2}
    default_backend b
backend b
    server s1 127.0.0.1:$bport
HAP
        cmd=(haproxy -f "$work/px.cfg")
    fi
}
run() {
    local n=$1 port pid
    port=$(free_port)
    peer_config "$port"
    # shellcheck disable=SC2086 # CG_OPTS is a list of options
    valgrind --tool=callgrind ${CG_OPTS:-} --callgrind-out-file="$work/cg.$n" "${cmd[@]}" \
        2>"$work/valgrind.$n" &
    pid=$!
    wait_up "$port" $pid "$work/valgrind.$n" || exit 1
    drive "$n" "$port" "$work/load.$n"
    # nginx (one process) exits on QUIT; HAProxy ignores QUIT and stops on TERM.
    kill -QUIT $pid 2>/dev/null || true
    sleep 1
    kill -TERM $pid 2>/dev/null || true
    wait $pid || true
    cg_total "$n"
}
cg_per_request "$who "
