#!/usr/bin/env python3
"""Side-by-side proxy benchmark: sluice, nginx (two buffer settings) and HAProxy in
front of one fast nginx backend, plus the backend measured directly. Each proxy also
listens with TLS (one ECDSA P-256 certificate for all, TLS 1.2/1.3 with the same ECDHE
AEAD suites, ALPN h2 and http/1.1) and reaches an HTTP/2 (h2c) listener of the
backend on /h2b/ where it can (nginx 1.22 cannot speak HTTP/2 to a backend).

Method (docs/performance.md): the proxy under test runs alone on CPU 0; the load
generator and the backend share CPU 1. Each measurement starts the proxy fresh, warms
it up for a second, then runs the load while reading the proxy's own CPU time
(utime + stime from /proc/PID/stat) before and after. Rounds interleave the proxies,
each round starting one later (A B C D, B C D A, ...), and the table reports medians
with the min-max spread.
Every process started here is killed by PID on exit, Ctrl-C included.
"""

import atexit
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SLUICE_BIN=path: another build of sluice in its place (bench/pgo.sh trains an
# instrumented one on these scenarios, then measures the profile-guided one).
SLUICE = os.path.abspath(os.environ.get("SLUICE_BIN") or os.path.join(ROOT, "target", "dist", "sluice"))
# Another sluice binary (an earlier commit's) measured in the same rounds, interleaved,
# as "sluice-base": the fair before/after on a noisy machine. BASE_SAME=1 when it is
# recent enough for the same config (an HTTP/3 listener, a memory cache route).
SLUICE_BASE = os.environ.get("SLUICE_BASE", "")
# FLOOR=path/to/sluice-floor (bench/floor.sh sets it): bare byte relays, over epoll and
# over io_uring (plain and multishot receives), as "floor-epoll", "floor-uring" and
# "floor-multi" in the relay scenarios — what a proxy that does no HTTP work costs here;
# in the new-connection scenario, "floor-epoll" is the least pooling proxy instead.
FLOOR = os.environ.get("FLOOR", "")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = int(os.environ.get("DURATION", "4"))
IDLE_CONNS = int(os.environ.get("IDLE_CONNS", "1000"))
# CONNS=16,64,256: every load-driven scenario at each of these client connection counts
# (h2load and h3load keep 8 requests in flight on each). One count keeps the scenario's
# plain name; several name it `scenario@N`.
CONNS = [int(c) for c in os.environ.get("CONNS", "64").split(",") if c]
ONLY = [p for p in os.environ.get("ONLY", "").split(",") if p]
TESTS_ONLY = [t for t in os.environ.get("TESTS", "").split(",") if t]
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
WORK = tempfile.mkdtemp(prefix="sluice-bench-")
os.chmod(WORK, 0o755)  # nginx workers run as an unprivileged user and must read big.bin
PROCS = []
CURRENT_TEST = ""


def which(name):
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    sys.exit(f"bench: {name} is not installed (bench/run.sh installs it)")


NGINX, HAPROXY, WRK, H2LOAD = which("nginx"), which("haproxy"), which("wrk"), which("h2load")
# Debian names php-fpm by its version (php-fpm8.2): the first one found.
PHP_FPM = next((os.path.join("/usr/sbin", n) for n in sorted(os.listdir("/usr/sbin")) if n.startswith("php-fpm")), None) \
    or sys.exit("bench: php-fpm is not installed (bench/run.sh installs it)")
NGINX_FASTCGI_PARAMS = "/etc/nginx/fastcgi_params"
# The system Python, where Debian's python3-websockets lives (bench/run.sh installs it).
PYTHON = "/usr/bin/python3"
WSECHO = os.path.join(ROOT, "bench", "wsecho.py")
# bench/h3load.rs, built by run.sh beside sluice.
H3LOAD = os.path.join(ROOT, "target", "dist", "examples", "h3load")
# bench/grpcecho.rs: the gRPC unary backend every proxy reaches for `grpc-unary`.
GRPCECHO = os.path.join(ROOT, "target", "dist", "examples", "grpcecho")
GRPC_BACKEND = 0
# One gRPC message (a 5-byte prefix and 16 bytes), posted by h2load for `grpc-unary`.
GRPC_MESSAGE = b"\x00\x00\x00\x00\x10" + b"0123456789abcdef"
WS_BACKEND = 0
BACKEND_H2 = 0
PHP_PORT = 0
CERT = KEY = COMBINED = ""


def kill_group(p, sig):
    """Signals the process and everything it started (nginx workers survive a killed master)."""
    try:
        os.killpg(p.pid, sig)
    except OSError:
        pass


def cleanup(*_):
    for p in PROCS:
        kill_group(p, signal.SIGKILL)
    for p in PROCS:
        try:
            p.wait(timeout=2)
        except Exception:
            pass
    subprocess.run(["rm", "-rf", WORK])


atexit.register(cleanup)
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: sys.exit(130))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, limit=10.0):
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"bench: process {proc.args} exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"bench: nothing listening on {port} after {limit}s")


def start(cmd, cpu, ports):
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    PROCS.append(p)
    for port in ports:
        wait_port(port, p)
    return p


def stop(p):
    kill_group(p, signal.SIGTERM)
    try:
        p.wait(timeout=3)
    except subprocess.TimeoutExpired:
        # bench/pgo.sh looks for this: a build with counters writes them at exit only.
        print(f"bench: {p.args[0]} did not exit within 3 s of SIGTERM; killed", file=sys.stderr, flush=True)
    kill_group(p, signal.SIGKILL)
    p.wait()


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return out


def cpu_ticks(pids):
    """(user, system) clock ticks of the processes."""
    user = system = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return user, system


def status_kib(pids, key):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    total += int(line.split()[1])
    return total


# --- the certificate ----------------------------------------------------------------

def make_cert():
    """One self-signed ECDSA P-256 certificate every proxy serves (and HAProxy's
    combined file)."""
    cert, key = os.path.join(WORK, "cert.pem"), os.path.join(WORK, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-days", "2", "-nodes", "-subj", "/CN=bench.test", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    combined = os.path.join(WORK, "combined.pem")
    with open(combined, "w") as f:
        f.write(open(cert).read() + open(key).read())
    return cert, key, combined


# TLS 1.2's suites, the same for every proxy: ECDHE with AES-GCM or ChaCha20-Poly1305
# (Mozilla "intermediate" less DHE, which rustls does not offer).
CIPHERS12 = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
             "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")


# --- the backend ------------------------------------------------------------------

def start_backend():
    port = free_port()
    global BACKEND_H2
    BACKEND_H2 = free_port()
    with open(os.path.join(WORK, "big.bin"), "wb") as f:
        f.write(b"x" * 65536)
    # 64 KiB of text that compresses like a web page does (not like a run of one byte).
    words = [b"proxy", b"backend", b"request", b"response", b"header", b"stream", b"pool", b"route", b"sluice", b"latency"]
    text = bytearray()
    i = 0
    while len(text) < 65536:
        text += b"<li class=\"item-%d\">%s %s %d</li>\n" % (i % 97, words[i % 10], words[(i * 7) % 10], i)
        i += 1
    with open(os.path.join(WORK, "text.txt"), "wb") as f:
        f.write(bytes(text[:65536]))
    conf = os.path.join(WORK, "backend.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1; daemon off; pid {WORK}/backend.pid; error_log {WORK}/backend.err;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
  access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
  client_body_temp_path {WORK}/b_body; proxy_temp_path {WORK}/b_proxy; fastcgi_temp_path {WORK}/b_fcgi;
  uwsgi_temp_path {WORK}/b_uwsgi; scgi_temp_path {WORK}/b_scgi;
  sendfile on; tcp_nopush on;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location = /small {{ default_type text/plain; return 200 "hello world!\\n"; }}
    location = /big {{ default_type application/octet-stream; alias {WORK}/big.bin; }}
    location = /text {{ default_type text/plain; alias {WORK}/text.txt; }}
    location = /cache/small {{ default_type text/plain; add_header Cache-Control "max-age=86400"; return 200 "hello world!\\n"; }}
    location = /cache/big {{ default_type application/octet-stream; add_header Cache-Control "max-age=86400"; alias {WORK}/big.bin; }}
  }}
  server {{
    listen 127.0.0.1:{BACKEND_H2} http2 backlog=4096;
    http2_max_requests 1000000; http2_max_concurrent_streams 256;
    location = /small {{ default_type text/plain; return 200 "hello world!\n"; }}
  }}
}}
""")
    p = start([NGINX, "-p", WORK, "-c", conf], 1, [port, BACKEND_H2])
    return p, port


def start_php():
    """php-fpm (a static pool of 2) with a trivial index.php, on the load side's CPU, and
    the folders the static-file and PHP scenarios serve."""
    global PHP_PORT
    PHP_PORT = free_port()
    os.makedirs(os.path.join(WORK, "php"), exist_ok=True)
    with open(os.path.join(WORK, "php", "index.php"), "w") as f:
        f.write("<?php echo \"hello world!\\n\";\n")
    os.makedirs(os.path.join(WORK, "static"), exist_ok=True)
    with open(os.path.join(WORK, "static", "file64k.bin"), "wb") as f:
        f.write(b"s" * 65536)
    conf = os.path.join(WORK, "fpm.conf")
    with open(conf, "w") as f:
        f.write(f"[global]\npid = {WORK}/fpm.pid\nerror_log = {WORK}/fpm.log\ndaemonize = no\n"
                f"[bench]\nuser = root\nlisten = 127.0.0.1:{PHP_PORT}\nlisten.backlog = 4096\npm = static\npm.max_children = 2\n"
                f"pm.max_requests = 0\n")
    return start([PHP_FPM, "-F", "-R", "-y", conf, "-p", WORK], 1, [PHP_PORT])


def start_ws_backend():
    """The WebSocket echo backend (python3-websockets) on the load side's CPU."""
    port = free_port()
    return start([PYTHON, WSECHO, "server", str(port)], 1, [port]), port


# --- the proxies --------------------------------------------------------------------

def nginx_proxy(backend, buffers16k):
    port, h2port, tls = free_port(), free_port(), free_port()
    name = "nginx16k" if buffers16k else "nginx"
    extra = "proxy_buffer_size 16k; proxy_buffers 8 16k; proxy_busy_buffers_size 32k;" if buffers16k else ""
    loc = f"location / {{ proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection \"\"; {extra} }}"
    loc += f" location /ws {{ proxy_pass http://127.0.0.1:{WS_BACKEND}; proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; proxy_read_timeout 300s; }}"
    loc += (f" location = /php/ {{ fastcgi_pass php; fastcgi_keep_conn on; include {NGINX_FASTCGI_PARAMS};"
            f" fastcgi_param SCRIPT_FILENAME {WORK}/php/index.php; fastcgi_param SCRIPT_NAME /index.php; }}")
    loc += f" location /static/ {{ alias {WORK}/static/; }}"
    # gRPC: grpc_pass over kept HTTP/2 connections (nginx speaks HTTP/2 to a backend
    # only for gRPC).
    loc += f" location /test.Echo/ {{ grpc_pass grpc://g; }}"
    # The cache scenarios: nginx's proxy_cache (files under WORK, read from the page
    # cache with sendfile), every request a hit after the warm-up. `tcp_nopush off`:
    # with it on, a 64 KiB hit (head and file sent apart) waits ~40 ms on a delayed ACK
    # and nginx serves ~200 req/s; off, it serves at its best.
    loc += f" location /cache/ {{ proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_cache c; tcp_nopush off; {extra} }}"
    conf = os.path.join(WORK, f"{name}.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1; daemon off; pid {WORK}/{name}.pid; error_log {WORK}/{name}.err;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
  access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
  client_body_temp_path {WORK}/{name}_body; proxy_temp_path {WORK}/{name}_proxy; fastcgi_temp_path {WORK}/{name}_fcgi;
  uwsgi_temp_path {WORK}/{name}_uwsgi; scgi_temp_path {WORK}/{name}_scgi;
  gzip on; gzip_comp_level 5; gzip_types text/plain; gzip_proxied any; gzip_vary on;
  upstream b {{ server 127.0.0.1:{backend}; keepalive 1024; keepalive_requests 1000000; }}
  proxy_cache_path {WORK}/{name}_cache levels=1:2 keys_zone=c:10m max_size=1g inactive=60m use_temp_path=off;
  upstream php {{ server 127.0.0.1:{PHP_PORT}; keepalive 8; }}
  upstream g {{ server 127.0.0.1:{GRPC_BACKEND}; keepalive 16; keepalive_requests 1000000; }}
  sendfile on; tcp_nopush on;
  server {{ listen 127.0.0.1:{port} backlog=4096; {loc} }}
  server {{ listen 127.0.0.1:{h2port} http2 backlog=4096; {loc} }}
  server {{ listen 127.0.0.1:{tls} ssl http2 backlog=4096; ssl_certificate {CERT}; ssl_certificate_key {KEY};
           ssl_protocols TLSv1.2 TLSv1.3; ssl_ciphers {CIPHERS12}; ssl_prefer_server_ciphers off;
           http2_max_requests 1000000; {loc} }}
}}
""")
    p = start([NGINX, "-p", WORK, "-c", conf], 0, [port, h2port, tls])
    time.sleep(0.1)
    return p, [p.pid] + children(p.pid), {"h1": port, "h2c": h2port, "tls": tls}


def haproxy_proxy(backend):
    port, h2port, tls = free_port(), free_port(), free_port()
    conf = os.path.join(WORK, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""
global
    nbthread 1
    maxconn 8000
    ssl-default-bind-ciphers {CIPHERS12}
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    http-reuse always
    compression algo gzip
    compression type text/plain
frontend f1
    bind 127.0.0.1:{port}
    use_backend w if {{ path_beg /ws }}
    use_backend h2b if {{ path_beg /h2b/ }}
    default_backend b
frontend f2
    bind 127.0.0.1:{h2port} proto h2
    use_backend g if {{ path_beg /test.Echo/ }}
    default_backend b
frontend f3
    bind 127.0.0.1:{tls} ssl crt {COMBINED} alpn h2,http/1.1
    default_backend b
backend b
    server s1 127.0.0.1:{backend}
backend h2b
    http-request replace-path /h2b(/.*) \\1
    server s2 127.0.0.1:{BACKEND_H2} proto h2
backend g
    server g1 127.0.0.1:{GRPC_BACKEND} proto h2
backend w
    timeout tunnel 300s
    server w1 127.0.0.1:{WS_BACKEND}
""")
    p = start([HAPROXY, "-f", conf, "-db"], 0, [port, h2port, tls])
    return p, [p.pid], {"h1": port, "h2c": h2port, "tls": tls}


# Five cheap filters on the default route (issue #13's bar: within 10 % of none).
FILTERS = ("request_id; allow 127.0.0.0/8; header_down X-Small yes when path /small; "
           "header_down X-Gateway sluice; rate_limit 1000000/s burst 1000000; ")


def sluice_proxy(backend, workers=1, cpu=0, binary=SLUICE, tls=True, filters="", observed=False):
    # FastCGI: max_conns as docs/config.md advises, at php-fpm's pm.max_children (2):
    # more connections than workers leave requests in php-fpm's accept queue.
    port, tls_port = free_port(), free_port()
    conf = os.path.join(WORK, "sluice.conf")
    # An older binary (SLUICE_BASE) may not know TLS or h2c backends.
    # HTTP/3 on the TLS port (UDP) for the binary under test only.
    # BASE_SAME=1: a recent SLUICE_BASE gets the same listeners and routes, so the two
    # binaries are compared on one config (without it the one under test alone runs a
    # QUIC endpoint and a 256 MiB memory cache: ~2 MiB more peak RSS).
    full = binary == SLUICE or os.environ.get("BASE_SAME") == "1"
    quic = " quic" if full else ""
    extra = f"listen 127.0.0.1:{tls_port} tls{quic}\n" if tls else ""
    # The cache scenarios' route: only the binary under test has the cache (not an
    # older SLUICE_BASE), so sluice-base skips them.
    cached = f"route /cache/* {{ cache {{ store memory 256M }} proxy 127.0.0.1:{backend} }} " if full else ""
    site = (f"tls {CERT} {KEY}; {cached}route /h2b/* {{ strip /h2b; proxy h2c://127.0.0.1:{BACKEND_H2} }} "
            f"route /php/* {{ strip /php; fastcgi 127.0.0.1:{PHP_PORT} {{ root {WORK}/php; max_conns 2 }} }} "
            f"route /static/* {{ strip /static; files {WORK}/static }} "
            f"route /test.Echo/* {{ proxy h2c://127.0.0.1:{GRPC_BACKEND} }} ") if tls else ""
    with open(conf, "w") as f:
        # observed: metrics (the admin API) and a JSON access log on, as an operator runs it.
        # OBSERVED="..." replaces those global options (to tell their costs apart).
        seen = os.environ.get("OBSERVED", f"admin 127.0.0.1:0; access_log {WORK}/access.log json")
        glob = seen if observed else "admin off"
        f.write(f"global {{ workers {workers}; {glob} }}\nlisten 127.0.0.1:{port}\n{extra}site * {{ {site}route /ws {{ proxy 127.0.0.1:{WS_BACKEND} }} {filters}proxy 127.0.0.1:{backend} }}\n")
    cmd = [binary, "run", "-c", conf]
    if cpu is None:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        PROCS.append(p)
        wait_port(port, p)
    else:
        p = start(cmd, cpu, [port])
    return p, [p.pid], {"h1": port, "h2c": port, "tls": tls_port if tls else None}


def floor_proxy(backend, mode):
    # A bare relay has no routes: the WebSocket scenario's relay goes to the echo server.
    if CURRENT_TEST == "ws-echo-1KiB":
        backend = WS_BACKEND
    if CURRENT_TEST == "new-connection":
        mode = "epoll-pool"
    port = free_port()
    p = start([FLOOR, mode, f"127.0.0.1:{port}", f"127.0.0.1:{backend}"], 0, [port])
    return p, [p.pid], {"h1": port, "h2c": None, "tls": None}


def direct(backend, backend_pids):
    return None, backend_pids, {"h1": backend, "h2c": None, "tls": None}


# --- the loads ----------------------------------------------------------------------

def to_us(v, unit):
    return float(v) * {"us": 1, "ms": 1000, "s": 1_000_000}[unit]


def wrk(port, path, conns, extra=(), duration=DURATION, scheme="http"):
    cmd = ["taskset", "-c", "1", WRK, "-t1", f"-c{conns}", f"-d{duration}s", "--latency"] + list(extra)
    out = subprocess.run(cmd + [f"{scheme}://127.0.0.1:{port}{path}"], capture_output=True, text=True, timeout=duration + 30).stdout
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    def us(s):
        m = re.match(r"([\d.]+)(us|ms|s)", s)
        return to_us(m.group(1), m.group(2))
    return {"requests": reqs - (int(errs.group(1)) if errs else 0), "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": us(lat["50"]), "p99": us(lat["99"])}


def h2load(port, conns, duration=DURATION, scheme="http"):
    cmd = ["taskset", "-c", "1", H2LOAD, "-c", str(conns), "-m", "8", "-D", str(duration), f"{scheme}://127.0.0.1:{port}/small"]
    return h2load_run(cmd, duration)


def h2load_run(cmd, duration):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30).stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out)
    rps = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    if not (m and rps and lat):
        sys.exit(f"bench: cannot read h2load output:\n{out}")
    return {"requests": int(m.group(1)), "rps": float(rps.group(1)), "p50": to_us(lat.group(5), lat.group(6)), "p99": to_us(lat.group(3), lat.group(4))}


def grpc_unary(port, conns, duration=DURATION):
    # h2load posts one gRPC message per call over h2c: 8 calls in flight on each connection.
    data = os.path.join(WORK, "grpc.bin")
    with open(data, "wb") as f:
        f.write(GRPC_MESSAGE)
    cmd = ["taskset", "-c", "1", H2LOAD, "-c", str(conns), "-m", "8", "-D", str(duration), "-d", data,
           "-H", "content-type: application/grpc", "-H", "te: trailers",
           f"http://127.0.0.1:{port}/test.Echo/Unary"]
    return h2load_run(cmd, duration)


def start_grpc_backend():
    global GRPC_BACKEND
    GRPC_BACKEND = free_port()
    return start([GRPCECHO, f"127.0.0.1:{GRPC_BACKEND}"], 1, [GRPC_BACKEND])


def h3load(port, conns, duration=DURATION):
    # As h2load's run: 8 requests in flight on each connection, pinned to CPU 1.
    cmd = ["taskset", "-c", "1", H3LOAD, f"127.0.0.1:{port}", "/small", "-c", str(conns), "-m", "8", "-D", str(duration)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30)
    out = run.stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out)
    rps = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us)\s+([\d.]+)(us)\s+([\d.]+)(us)", out)
    if not (m and rps and lat):
        sys.exit(f"bench: cannot read h3load output (exit {run.returncode}):\n{out}{run.stderr}")
    refused = re.search(r"connections: (\d+) made, (\d+) failed", out)
    if refused and int(refused.group(2)):
        print(f"bench: h3load ran on {refused.group(1)} of {conns} connections:\n{run.stderr}", file=sys.stderr)
    return {"requests": int(m.group(1)), "rps": float(rps.group(1)), "p50": float(lat.group(5)), "p99": float(lat.group(3))}


def ws_echo(port, duration=DURATION):
    cmd = ["taskset", "-c", "1", PYTHON, WSECHO, "client", f"ws://127.0.0.1:{port}/ws", "32", str(duration), "1024"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30)
    try:
        return json.loads(out.stdout)
    except ValueError:
        sys.exit(f"bench: the WebSocket client failed:\n{out.stdout}{out.stderr}")


def idle_probe(port, pids):
    """RSS growth per idle keep-alive client connection, after one request each.
    Requests go one at a time, so the proxy needs one backend connection, not 1000:
    what grows is the cost of the idle client connections alone."""
    before = status_kib(pids, "VmRSS:")
    socks = []
    req = b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n"
    for _ in range(IDLE_CONNS):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req)
        got = b""
        while b"hello world!\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                sys.exit("bench: the proxy closed a connection during the idle probe")
            got += chunk
        socks.append(s)
    time.sleep(1.0)
    after = status_kib(pids, "VmRSS:")
    for s in socks:
        s.close()
    return {"bytes_per_conn": (after - before) * 1024 / IDLE_CONNS, "rss_kib": after}


TESTS = {
    "keepalive-13B": lambda p, c: wrk(p["h1"], "/small", c),
    "keepalive-64KiB": lambda p, c: wrk(p["h1"], "/big", c),
    # 64 KiB of text compressed on the way (gzip: level 5 for nginx and sluice; HAProxy's
    # default maximum level is 1).
    "gzip-64KiB": lambda p, c: wrk(p["h1"], "/text", c, ["-H", "Accept-Encoding: gzip"]),
    "new-connection": lambda p, c: wrk(p["h1"], "/small", c, ["-H", "Connection: close"]),
    # WebSocket echo: 32 sockets, 1 KiB binary messages, one in flight per socket; a
    # "request" is a message echoed (the client and echo server are Python, on CPU 1).
    "ws-echo-1KiB": lambda p, c: ws_echo(p["h1"]),
    "h2c-front": lambda p, c: h2load(p["h2c"], c),
    # TLS in front: keep-alive HTTP/1.1 (wrk, no ALPN) and HTTP/2 (h2load, ALPN h2).
    "tls-h1-13B": lambda p, c: wrk(p["tls"], "/small", c, scheme="https"),
    "tls-h2-13B": lambda p, c: h2load(p["tls"], c, scheme="https"),
    # HTTP/3 (bench/h3load.rs, h2load's shape) on the same TLS port's UDP twin: sluice
    # only (Debian's nginx and HAProxy are built without QUIC).
    "h3-13B": lambda p, c: h3load(p["tls"], c),
    # HTTP/1.1 in front, HTTP/2 (h2c) to the backend.
    "h2-backend-13B": lambda p, c: wrk(p["h1"], "/h2b/small", c),
    # A trivial PHP script through php-fpm (2 workers) with kept-alive FastCGI
    # connections; a 64 KiB static file from the page cache (nginx: sendfile).
    "php-fpm": lambda p, c: wrk(p["h1"], "/php/", 16),
    "static-64KiB": lambda p, c: wrk(p["h1"], "/static/file64k.bin", c),
    # Every request a cache hit (the warm-up stores the response): sluice's memory
    # store against nginx's proxy_cache.
    "cache-hit-13B": lambda p, c: wrk(p["h1"], "/cache/small", c),
    "cache-hit-64KiB": lambda p, c: wrk(p["h1"], "/cache/big", c),
    # gRPC unary calls over h2c to bench/grpcecho.rs (nginx: grpc_pass; HAProxy: an h2
    # server line; sluice: an h2c:// pool).
    "grpc-unary": lambda p, c: grpc_unary(p["h2c"], c),
}

# Their load does not grow with CONNS: php-fpm has two workers, the WebSocket client its
# own 32 sockets.
FIXED_CONNS = {"php-fpm", "ws-echo-1KiB"}
# Which proxies cannot run a test: the backend alone has no proxy features, nginx 1.22
# cannot speak HTTP/2 to a backend.
SKIP = {
    "h2c-front": {"direct"},
    "grpc-unary": {"direct", "nginx16k", "sluice-base"},
    "ws-echo-1KiB": {"direct"},
    "tls-h1-13B": {"direct"},
    "tls-h2-13B": {"direct"},
    "h3-13B": {"direct", "nginx", "nginx16k", "haproxy", "sluice-base"},
    "h2-backend-13B": {"direct", "nginx", "nginx16k"},
    # HAProxy's FastCGI and file serving are not set up here.
    "php-fpm": {"direct", "haproxy", "nginx16k"},
    "static-64KiB": {"direct", "haproxy", "nginx16k"},
    "cache-hit-13B": {"direct", "haproxy", "nginx16k", "sluice-base"},
    "cache-hit-64KiB": {"direct", "haproxy", "nginx16k", "sluice-base"},
}
# The bare relays open a backend connection per client connection and relay whatever
# comes: only keep-alive loads over plain TCP measure them fairly. A new connection a
# request has its own floor over epoll (`epoll-pool`: backend connections kept, one
# fixed request sent on them), none over io_uring.
FLOOR_TESTS = {"keepalive-13B", "keepalive-64KiB", "ws-echo-1KiB", "new-connection"}


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < IDLE_CONNS + 200:
        sys.exit(f"bench: the descriptor limit {hard} is too low for {IDLE_CONNS} idle connections")
    global CERT, KEY, COMBINED, CURRENT_TEST
    CERT, KEY, COMBINED = make_cert()
    backend_proc, backend = start_backend()
    start_php()
    global WS_BACKEND
    _, WS_BACKEND = start_ws_backend()
    start_grpc_backend()
    time.sleep(0.2)
    backend_pids = [backend_proc.pid] + children(backend_proc.pid)
    proxies = {
        "direct": lambda: direct(backend, backend_pids),
        "nginx": lambda: nginx_proxy(backend, False),
        "nginx16k": lambda: nginx_proxy(backend, True),
        "haproxy": lambda: haproxy_proxy(backend),
        "sluice": lambda: sluice_proxy(backend),
        # Only when asked for (ONLY=sluice,sluice-filters): the filters' cost.
        "sluice-filters": lambda: sluice_proxy(backend, filters=FILTERS),
        # Only when asked for (ONLY=sluice,sluice-observed): metrics and access log on.
        "sluice-observed": lambda: sluice_proxy(backend, observed=True),
        # Only when asked for (ONLY=sluice,sluice-w2): `workers 2` on the same one core,
        # so its CPU a request is compared with `workers 1`'s.
        "sluice-w2": lambda: sluice_proxy(backend, workers=2),
    }
    if SLUICE_BASE:
        # SLUICE_BASE_PLAIN=1: an older binary without TLS listeners, FastCGI or h2c pools.
        plain = os.environ.get("SLUICE_BASE_PLAIN") == "1"
        proxies["sluice-base"] = lambda: sluice_proxy(backend, binary=SLUICE_BASE, tls=not plain)
    if FLOOR:
        proxies["floor-epoll"] = lambda: floor_proxy(backend, "epoll")
        proxies["floor-uring"] = lambda: floor_proxy(backend, "uring")
        proxies["floor-multi"] = lambda: floor_proxy(backend, "uring-multi")
        floors = {"floor-epoll", "floor-uring", "floor-multi"}
        for test in TESTS:
            if test not in FLOOR_TESTS:
                SKIP.setdefault(test, set()).update(floors)
        SKIP.setdefault("idle", set()).update(floors)
        SKIP.setdefault("new-connection", set()).update({"floor-uring", "floor-multi"})
    if ONLY:
        proxies = {k: v for k, v in proxies.items() if k in ONLY}
    else:
        del proxies["sluice-filters"]
        del proxies["sluice-observed"]
        del proxies["sluice-w2"]
    # (label, scenario, connections) for each measurement of a round.
    runs = []
    for t in list(TESTS) + ["idle"]:
        if TESTS_ONLY and t not in TESTS_ONLY:
            continue
        counts = [CONNS[0]] if t in FIXED_CONNS or t == "idle" else CONNS
        runs += [(t if len(counts) == 1 else f"{t}@{c}", t, c) for c in counts]
    tests = [label for label, _, _ in runs]
    results = {}  # (test, proxy) -> list of dicts
    started = time.time()
    for rnd in range(ROUNDS):
        # Each round starts one proxy later: a place in the order (right after another
        # proxy's run, or first) moved the figures more than a 5 % change did.
        turn = rnd % len(proxies)
        order = list(proxies.items())[turn:] + list(proxies.items())[:turn]
        for test, scenario, conns in runs:
            for name, make in order:
                if name in SKIP.get(scenario, ()):
                    continue
                CURRENT_TEST = scenario
                proc, pids, ports = make()
                try:
                    if scenario == "idle":
                        wrk(ports["h1"], "/small", 8, duration=1)
                        time.sleep(0.3)
                        r = idle_probe(ports["h1"], pids)
                    else:
                        TESTS[scenario](ports, conns) if DURATION > 1 else None  # warm-up on the same path
                        t0 = cpu_ticks(pids)
                        r = TESTS[scenario](ports, conns)
                        t1 = cpu_ticks(pids)
                        per = TICK * max(r["requests"], 1) / 1e6
                        r["user_us"] = (t1[0] - t0[0]) / per
                        r["sys_us"] = (t1[1] - t0[1]) / per
                        r["cpu_us"] = r["user_us"] + r["sys_us"]
                        r["peak_rss_kib"] = status_kib(pids, "VmHWM:")
                finally:
                    if proc is not None:
                        stop(proc)
                results.setdefault((test, name), []).append(r)
                print(f"round {rnd + 1}/{ROUNDS} {test:16} {name:12} " + " ".join(f"{k}={v:.1f}" for k, v in r.items()), flush=True)
    scaling = None
    if os.environ.get("SCALING", "1") == "1" and (not ONLY or "sluice" in ONLY) and not TESTS_ONLY:
        scaling = measure_scaling(backend)
    report(results, proxies, tests, scaling, time.time() - started)


def measure_scaling(backend):
    """workers 1 vs workers 2 with no pinning: req/s with a load side that has room."""
    out = {}
    for workers in (1, 2, 1, 2):
        proc, pids, ports = sluice_proxy(backend, workers=workers, cpu=None)
        port = ports["h1"]
        try:
            cmd = [WRK, "-t2", "-c128", f"-d{DURATION}s", f"http://127.0.0.1:{port}/small"]
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=DURATION + 30).stdout
            out.setdefault(workers, []).append(float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)))
        finally:
            stop(proc)
    return out


def med(xs):
    return statistics.median(xs)


def report(results, proxies, tests, scaling, took):
    lines = []
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
    lines.append(f"sluice bench — {time.strftime('%Y-%m-%d %H:%M')} — {os.cpu_count()} CPUs ({cpu}), {ROUNDS} rounds x {DURATION}s, took {took:.0f}s")
    lines.append("medians, [min-max] over rounds; cpu = the proxy's own user+system CPU per request")
    if os.environ.get("SLUICE_BIN"):
        lines.append(f"sluice = {SLUICE}")
    lines.append("")
    for test in tests:
        lines.append(f"## {test}")
        if test == "idle":
            lines.append(f"{'proxy':12} {'bytes/idle conn':>18} {'[min-max]':>18} {'RSS KiB':>9}")
            for name in proxies:
                rs = results.get((test, name))
                if rs:
                    b = [r["bytes_per_conn"] for r in rs]
                    lines.append(f"{name:12} {med(b):18.0f} {'[%.0f-%.0f]' % (min(b), max(b)):>18} {med([r['rss_kib'] for r in rs]):9.0f}")
        else:
            lat = "mean/max" if test.split("@")[0] in ("h2c-front", "tls-h2-13B", "h3-13B", "grpc-unary") else "p50/p99"
            lines.append(f"{'proxy':12} {'req/s':>9} {'[min-max]':>17} {'cpu us/req':>10} {'[min-max]':>13} {'user/sys':>11} {lat + ' us':>16} {'peak RSS KiB':>12}")
            for name in proxies:
                rs = results.get((test, name))
                if not rs:
                    continue
                rps = [r["rps"] for r in rs]
                c = [r["cpu_us"] for r in rs]
                split = "%.1f/%.1f" % (med([r["user_us"] for r in rs]), med([r["sys_us"] for r in rs]))
                lines.append(f"{name:12} {med(rps):9.0f} {'[%.0f-%.0f]' % (min(rps), max(rps)):>17} {med(c):10.1f} {'[%.1f-%.1f]' % (min(c), max(c)):>13} {split:>11} "
                             f"{'%.0f/%.0f' % (med([r['p50'] for r in rs]), med([r['p99'] for r in rs])):>16} {med([r['peak_rss_kib'] for r in rs]):12.0f}")
        lines.append("")
    if "sluice" in proxies:
        lines.append("## ratios sluice / other (medians; below 1.0 is sluice better)")
        for test in tests:
            key = "bytes_per_conn" if test == "idle" else "cpu_us"
            s = results.get((test, "sluice"))
            if not s:
                continue
            parts = []
            for other in ("nginx", "nginx16k", "haproxy", "floor-epoll", "floor-uring", "floor-multi"):
                o = results.get((test, other))
                if o and med([r[key] for r in o]) > 0:
                    parts.append(f"÷{other} {med([r[key] for r in s]) / med([r[key] for r in o]):.2f}")
            if test != "idle" and results.get((test, "nginx")):
                user = [r["user_us"] for r in results[(test, "nginx")]]
                if med(user) > 0:
                    parts.append(f"user÷nginx {med([r['user_us'] for r in s]) / med(user):.2f}")
                parts.append(f"p99÷nginx {med([r['p99'] for r in s]) / med([r['p99'] for r in results[(test, 'nginx')]]):.2f}")
            base = results.get((test, "sluice-base"))
            if base and med([r[key] for r in base]) > 0:
                parts.append(f"÷base {med([r[key] for r in s]) / med([r[key] for r in base]):.2f}")
            lines.append(f"{test:20} {'cpu' if test != 'idle' else 'mem'}: " + "  ".join(parts))
        for test in tests:
            if test.split("@")[0] != "h3-13B":
                continue
            h3, h2 = results.get((test, "sluice")), results.get((test.replace("h3-13B", "tls-h2-13B"), "sluice"))
            if h3 and h2:
                lines.append(f"{test:16} cpu: ÷tls-h2-13B (sluice) {med([r['cpu_us'] for r in h3]) / med([r['cpu_us'] for r in h2]):.2f}")
        lines.append("")
    if scaling:
        w1, w2 = med(scaling[1]), med(scaling[2])
        lines.append(f"## scaling, unpinned, wrk -t2 -c128: workers 1 {w1:.0f} req/s, workers 2 {w2:.0f} req/s, ratio {w2 / w1:.2f}")
        lines.append("")
    text = "\n".join(lines)
    print("\n" + text)
    # A partial run (TESTS= or ONLY=) does not replace the whole table of record.
    partial = TESTS_ONLY or ONLY
    path = os.path.join(ROOT, "bench", "results-partial.txt" if partial else "results.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
