# Shared by bench/callgrind.sh and bench/syscalls.sh (sourced, not run): installs what
# is missing, builds sluice when no binary is given, starts an nginx backend answering
# `/small` (13 bytes) and `/big` (64 KiB), and writes a sluice config in front of it.
#   need_tools valgrind:valgrind nginx:nginx ...   (command:package pairs)
#   sluice_bin [path]      -> $bin
#   start_backend          -> $work, $bport (cleaned up on exit; NGINX_WORKERS=N
#                             workers, BACKEND_CPUS=LIST pins them)
#   sluice_config PORT     -> $work/sluice.conf (SLUICE_ADMIN, SLUICE_GLOBAL, SLUICE_FILTERS;
#                             TLS=1: a TLS listener with a fresh self-signed certificate)
#   $scheme                -> http or https, as TLS says
#   wait_up PORT [PID LOG] -> PORT answers /small (h2c with prior knowledge when $h2c is
#                             set); fails when PID exits first, with LOG's last lines
#   drive N PORT OUT       -> N requests of /$URL_PATH (small) to PORT, the load's report in
#                             OUT: `h2load $LOAD` (TARGETS=FILE: its targets in turn), or
#                             with NEW_CONN=1 `ab -c 16` (NEW_CONN_C=256: `-c 256`), a
#                             new connection a request; says on stderr when requests
#                             failed
#   cg_total N             -> the instructions of callgrind's $work/cg.N (kept as $CG_KEEP.N
#                             when CG_KEEP is set)
#   cg_per_request LABEL   -> runs `run N1` and `run N2`, prints the difference a request
need_tools() {
    local missing=() tool
    for tool in "$@"; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}
sluice_bin() {
    bin=${1:-}
    if [ -z "$bin" ]; then
        cargo build --profile dist --quiet
        bin=target/dist/sluice
    fi
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_backend() {
    work=$(mktemp -d)
    trap '[ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null; rm -rf "$work"' EXIT
    bport=$(free_port)
    cat >"$work/nginx.conf" <<NGX
daemon on; worker_processes ${NGINX_WORKERS:-1}; pid $work/nginx.pid; error_log $work/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$bport; keepalive_requests 1000000;
  location /small { return 200 "hello, world\n"; }
  location /big { root $work/www; } } }
NGX
    chmod 755 "$work"
    mkdir -p "$work/www"
    head -c 65536 /dev/urandom >"$work/www/big"
    ${BACKEND_CPUS:+taskset -c "$BACKEND_CPUS"} nginx -c "$work/nginx.conf" -p "$work"
}
scheme=http
[ -n "${TLS:-}" ] && scheme=https
sluice_config() {
    local listen_tls="" site_tls=""
    if [ -n "${TLS:-}" ]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
            -keyout "$work/key.pem" -out "$work/cert.pem" -subj /CN=localhost \
            -addext subjectAltName=DNS:localhost 2>/dev/null
        listen_tls=" tls"
        site_tls="tls $work/cert.pem $work/key.pem"
    fi
    printf 'global { workers 1; admin %s; %s }\nlisten 127.0.0.1:%s%s\nsite * {\n%s\n%s\nproxy 127.0.0.1:%s %s }\n' "${SLUICE_ADMIN:-off}" "${SLUICE_GLOBAL:-}" "$1" "$listen_tls" "$site_tls" "$(printf '%s' "${SLUICE_FILTERS:-}" | tr ';' '\n')" "$bport" "${SLUICE_PROXY:-}" >"$work/sluice.conf"
}
wait_up() {
    local port=$1 pid=${2:-} log=${3:-}
    for _ in $(seq 100); do
        curl -sk -o /dev/null ${h2c:+--http2-prior-knowledge} "$scheme://127.0.0.1:$port/small" && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.2
    done
    echo "nothing answered on port $port" >&2
    if [ -n "$log" ]; then tail -5 "$log" >&2; fi
    return 1
}
drive() {
    local n=$1 port=$2 out=$3 url="$scheme://127.0.0.1:$2/${URL_PATH:-small}"
    if [ -n "${NEW_CONN:-}" ]; then
        ab -q -c "${NEW_CONN_C:-16}" -n "$n" "$url" >"$out" 2>&1
        grep -q "^Failed requests: *0$" "$out" || grep -E "^(Complete|Failed) requests" "$out" >&2
        return 0
    fi
    if [ -n "${TARGETS:-}" ]; then
        sed "s|^|$scheme://127.0.0.1:$port/|" "$TARGETS" >"$work/uris"
        # shellcheck disable=SC2086 # LOAD is a list of h2load's options
        h2load $LOAD -n "$n" -i "$work/uris" >"$out"
    else
        # shellcheck disable=SC2086
        h2load $LOAD -n "$n" "$url" >"$out"
    fi
    grep -q " 0 failed, 0 errored" "$out" || grep "requests:" "$out" >&2
}
cg_total() {
    if [ -n "${CG_KEEP:-}" ]; then cp "$work/cg.$1" "$CG_KEEP.$1"; fi
    grep -m1 '^summary:' "$work/cg.$1" | awk '{print $2}'
}
cg_per_request() {
    local a b
    a=$(run "$N1")
    b=$(run "$N2")
    echo "${1}instructions: $N1 requests $a, $N2 requests $b"
    echo "per request: $(( (b - a) / (N2 - N1) ))"
}
