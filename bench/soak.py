#!/usr/bin/env python3
"""A soak: mixed load through sluice while things break around it.

    bench/soak.sh [MINUTES]          (30 by default; the shell script installs and builds)

Load, all at once and for the whole run: HTTP/1.1 keep-alive and HTTP/2 in the clear
and over TLS (h2load), a new connection per request (ab), 256 KiB uploads, server-sent
event streams, WebSocket echoes, FastCGI (php-fpm), and a pool reached through a DNS
name. Faults: the config is reloaded every 10 s (each time with a change), one of the
two plain backends is killed (SIGKILL) every 60 s and restarted 3 s later, a third
backend answers every request 300 ms late, the test DNS server moves the name between
two addresses every 15 s, and Redis (the rate limiter's store, `failure open`) is
stopped for 60 s in the middle of the run.

What must hold: no request fails that a healthy backend could have served (every
fault above leaves one that could); sluice's RSS and open descriptors are flat after
the warm-up (last fifth within 5 % of the second fifth); every log line above INFO is
explained by an injected fault. Prints the figures, writes bench/soak-results.txt,
and draws RSS and descriptors over time into docs/soak.png (gnuplot).
"""

import http.client
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target", "dist", "sluice")
PY = "/usr/bin/python3"  # Debian's, with python3-websockets
MINUTES = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
END = time.time() + MINUTES * 60
WORK = tempfile.mkdtemp(prefix="sluice-soak-")
procs = []
lock = threading.Lock()
# kind -> [done, failed]; failures are also listed with their time and reason.
totals = {}
failures = []
faults = []  # (time, what)
T0 = time.time()


def free_ports(names):
    """Distinct free loopback ports, all held open while they are picked."""
    held = [socket.socket() for _ in names]
    for s in held:
        s.bind(("127.0.0.1", 0))
    ports = {n: s.getsockname()[1] for n, s in zip(names, held)}
    for s in held:
        s.close()
    return ports


def spawn(name, args, **kw):
    log = open(os.path.join(WORK, name + ".log"), "ab")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
    procs.append(p)
    return p


stopping = threading.Event()


def stop_all():
    stopping.set()
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(1)
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_port(port, host="127.0.0.1"):
    for _ in range(200):
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"soak: nothing listens on {host}:{port}")


def count(kind, done, failed=0, why=""):
    with lock:
        t = totals.setdefault(kind, [0, 0])
        t[0] += done
        t[1] += failed
        if failed:
            failures.append((round(time.time() - T0, 1), kind, failed, why))


def fault(what):
    with lock:
        faults.append((round(time.time() - T0, 1), what))


# ---------------------------------------------------------------- backends

APP = r'''
import http.server, socketserver, sys, time, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(20):
                self.wfile.write(b"data: tick %d\n\n" % i); self.wfile.flush(); time.sleep(0.1)
            self.close_connection = True
            return
        body = b"slow\n" if SLOW else b"app\n"
        if SLOW: time.sleep(0.3)
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0)); got = 0
        while got < n:
            b = self.rfile.read(min(65536, n - got))
            if not b: return
            got += len(b)
        body = str(got).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 512
SLOW = sys.argv[1] == "slow"
servers = [S((h, int(sys.argv[2])), H) for h in sys.argv[3:]]
for s in servers[1:]: threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
'''


class Dns(threading.Thread):
    """A DNS server for one name, `flap.test`, whose A answer (TTL 1) moves between
    127.0.0.1 and 127.0.0.2 every 15 s. Every other question gets NXDOMAIN."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addr = "127.0.0.1"

    def run(self):
        while True:
            q, peer = self.sock.recvfrom(512)
            if len(q) < 12:
                continue
            i, labels = 12, []
            while i < len(q) and q[i]:
                labels.append(q[i + 1 : i + 1 + q[i]].decode("ascii", "replace"))
                i += 1 + q[i]
            qtype = struct.unpack("!H", q[i + 1 : i + 3])[0] if i + 3 <= len(q) else 0
            question = q[12 : i + 5]
            name = ".".join(labels).lower()
            flags = 0x8180
            answers = b""
            if name == "flap.test":
                if qtype == 1:
                    answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 1, 4) + socket.inet_aton(self.addr)
            else:
                flags = 0x8183
            head = q[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0)
            self.sock.sendto(head + question + answers, peer)


# ---------------------------------------------------------------- sluice

def config(ports, rev):
    return f"""
global {{
    admin 127.0.0.1:{ports['admin']}
    resolver 127.0.0.1:{ports['dns']}
    {"access_log " + WORK + "/access.log json" if os.environ.get("SOAK_ACCESS_LOG") else ""}
}}
listen 127.0.0.1:{ports['plain']}
listen 127.0.0.1:{ports['tls']} tls
site * {{
    tls localhost.pem localhost.key
    header_down X-Soak-Revision {rev}
    route /sse/* {{ proxy 127.0.0.1:{ports['app']} }}
    route /upload/* {{ proxy 127.0.0.1:{ports['app']} }}
    route /ws/* {{ proxy 127.0.0.1:{ports['ws']} }}
    route /php/* {{
        strip /php
        fastcgi 127.0.0.1:{ports['fpm']} {{ root {WORK}/php }}
    }}
    route /dns/* {{ proxy flap.test:{ports['app']} }}
    rate_limit 1000000/s store redis://127.0.0.1:{ports['redis']} failure open
    proxy 127.0.0.1:{ports['a1']} 127.0.0.1:{ports['a2']} 127.0.0.1:{ports['slow']} {{
        lb least_conn
        retries 2
        # A GET in flight on a backend killed under it goes to another one.
        retry_on reset
        health /health {{ interval 1s; timeout 1s; fall 2; rise 2 }}
    }}
}}
"""


def sample(pid, out):
    """RSS (KiB) and open descriptors of `pid`, every 5 s."""
    while time.time() < END:
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, AttributeError):
            return
        out.append((round(time.time() - T0, 1), rss, fds))
        time.sleep(5)


# ---------------------------------------------------------------- load

def h2load(kind, args):
    while time.time() < END - 5:
        secs = int(min(20, END - time.time() - 3))
        if secs < 2:
            break
        r = subprocess.run(["h2load", "-D", str(secs)] + args, capture_output=True, text=True)
        m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", r.stdout)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", r.stdout)
        if not m or not codes:
            count(kind, 0, 1, "h2load printed no summary: " + r.stderr[-200:])
            continue
        # h2load's "failed" includes the errored, the timed out and non-2xx answers.
        done, failed = int(m.group(1)), int(m.group(3))
        bad = int(codes.group(3)) + int(codes.group(4))
        count(kind, done, failed, f"h2load: {failed} failed ({m.group(4)} errored, {bad} 4xx/5xx)")


def ab(kind, url):
    while time.time() < END - 5:
        r = subprocess.run(["ab", "-q", "-n", "300", "-c", "2", "-s", "10", url], capture_output=True, text=True)
        done = re.search(r"Complete requests:\s+(\d+)", r.stdout)
        failed = re.search(r"Failed requests:\s+(\d+)", r.stdout)
        non2xx = re.search(r"Non-2xx responses:\s+(\d+)", r.stdout)
        if not done:
            count(kind, 0, 1, "ab: " + (r.stderr or r.stdout)[-200:])
            time.sleep(1)
            continue
        # ab calls a body of another length than the first "failed"; the pool's peers
        # answer with their own names, so only the other kinds count.
        kinds = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)", r.stdout)
        broken = sum(int(g) for g in kinds.groups()) if kinds else int(failed.group(1))
        bad = broken + (int(non2xx.group(1)) if non2xx else 0)
        count(kind, int(done.group(1)), bad, f"ab: {broken} connect/receive/exceptions, {bad - broken} non-2xx")
        time.sleep(0.5)


def uploads(port):
    body = os.urandom(256 * 1024)
    while time.time() < END - 2:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            for _ in range(20):
                c.request("POST", "/upload/x", body=body)
                r = c.getresponse()
                got = r.read()
                ok = r.status == 200 and got == str(len(body)).encode()
                count("upload 256 KiB", 1, 0 if ok else 1, f"status {r.status} {got[:40]!r}")
                time.sleep(0.1)
        except Exception as e:
            count("upload 256 KiB", 0, 1, repr(e))
        finally:
            c.close()


def sse(port):
    while time.time() < END - 3:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            c.request("GET", "/sse/stream")
            r = c.getresponse()
            events = r.read().count(b"data: tick")
            count("SSE stream (20 events)", 1, 0 if r.status == 200 and events == 20 else 1, f"status {r.status}, {events} events")
        except Exception as e:
            count("SSE stream (20 events)", 0, 1, repr(e))
        finally:
            c.close()


def websockets(port):
    while time.time() < END - 5:
        secs = int(min(20, END - time.time() - 3))
        if secs < 2:
            break
        r = subprocess.run([PY, os.path.join(ROOT, "bench", "wsecho.py"), "client", f"ws://127.0.0.1:{port}/ws/echo", "2", str(secs), "1024"], capture_output=True, text=True)
        try:
            n = json.loads(r.stdout.strip().splitlines()[-1])["requests"]
            count("WebSocket echo 1 KiB", n, 0 if r.returncode == 0 else 1, r.stderr[-200:])
        except Exception:
            count("WebSocket echo 1 KiB", 0, 1, (r.stderr or r.stdout)[-300:])


def named(port):
    c = None
    while time.time() < END - 2:
        try:
            if c is None:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/dns/x")
            r = c.getresponse()
            r.read()
            count("pool by DNS name", 1, 0 if r.status == 200 else 1, f"status {r.status}")
        except Exception as e:
            count("pool by DNS name", 0, 1, repr(e))
            c = None
        time.sleep(0.05)


# ---------------------------------------------------------------- faults

def faults_loop(ports, backends, dns, redis_cmd, redis):
    """Each fault on its own clock: reload every 10 s, kill a plain backend every 60 s
    (restarted 3 s later), move the DNS answer every 15 s, Redis down for 60 s at half
    time."""
    start = time.time()
    at = {"reload": start + 10, "kill": start + 60, "flap": start + 15, "redis": start + MINUTES * 30}
    rev, killed = 1, 0
    conf = os.path.join(WORK, "sluice.conf")

    def restart(name):
        if stopping.is_set():
            return
        backends[name] = spawn(name, [SLUICE, "run", "-c", os.path.join(WORK, name + ".conf")])
        fault(f"restarted backend {name}")

    def redis_up():
        if stopping.is_set():
            return
        spawn("redis", redis_cmd)
        fault("started Redis again")

    while time.time() < END - 2:
        time.sleep(0.25)
        now = time.time()
        if now >= at["reload"]:
            at["reload"] += 10
            rev += 1
            with open(conf, "w") as f:
                f.write(config(ports, rev))
            try:
                c = http.client.HTTPConnection("127.0.0.1", ports["admin"], timeout=10)
                c.request("POST", "/reload", body="{}", headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                count("reload", 1 if r.status == 200 else 0, 0 if r.status == 200 else 1, f"status {r.status}")
            except Exception as e:
                count("reload", 0, 1, repr(e))
        if now >= at["kill"]:
            at["kill"] += 60
            name = "a1" if killed % 2 == 0 else "a2"
            killed += 1
            os.killpg(backends[name].pid, signal.SIGKILL)
            fault(f"killed backend {name} (127.0.0.1:{ports[name]})")
            threading.Timer(3, restart, (name,)).start()
        if now >= at["flap"]:
            at["flap"] += 15
            dns.addr = "127.0.0.2" if dns.addr == "127.0.0.1" else "127.0.0.1"
            fault(f"flap.test now answers {dns.addr}")
        if redis is not None and now >= at["redis"]:
            os.killpg(redis.pid, signal.SIGTERM)
            redis.wait()
            redis = None
            fault("stopped Redis")
            threading.Timer(60, redis_up).start()


# ---------------------------------------------------------------- main

def php_fpm():
    for d in ("/usr/sbin",):
        for n in sorted(os.listdir(d), reverse=True):
            if n.startswith("php-fpm"):
                return os.path.join(d, n)
    raise SystemExit("soak: php-fpm is not installed")


def main():
    ports = free_ports(("admin", "plain", "tls", "a1", "a2", "slow", "app", "ws", "fpm", "redis"))
    dns = Dns()
    dns.start()
    ports["dns"] = dns.port
    for f in ("localhost.pem", "localhost.key"):
        with open(os.path.join(ROOT, "examples", "certs", f), "rb") as src, open(os.path.join(WORK, f), "wb") as dst:
            dst.write(src.read())
    os.makedirs(os.path.join(WORK, "php"))
    with open(os.path.join(WORK, "php", "hello.php"), "w") as f:
        f.write("<?php echo 'hello from php ', getmypid();")
    backends = {}
    for name in ("a1", "a2"):
        with open(os.path.join(WORK, name + ".conf"), "w") as f:
            f.write(f'global {{ admin off }}\nlisten 127.0.0.1:{ports[name]}\nsite * {{ respond "{name}\\n" }}\n')
        backends[name] = spawn(name, [SLUICE, "run", "-c", os.path.join(WORK, name + ".conf")])
    spawn("slow", [PY, "-c", APP, "slow", str(ports["slow"]), "127.0.0.1"])
    spawn("app", [PY, "-c", APP, "app", str(ports["app"]), "127.0.0.1", "127.0.0.2"])
    spawn("ws", [PY, os.path.join(ROOT, "bench", "wsecho.py"), "server", str(ports["ws"])])
    with open(os.path.join(WORK, "fpm.conf"), "w") as f:
        f.write(f"[global]\npid = {WORK}/fpm.pid\nerror_log = {WORK}/fpm-error.log\ndaemonize = no\n"
                f"[www]\nuser = root\nlisten = 127.0.0.1:{ports['fpm']}\npm = static\npm.max_children = 4\n")
    spawn("php-fpm", [php_fpm(), "-F", "-R", "-y", os.path.join(WORK, "fpm.conf"), "-p", WORK])
    redis_cmd = ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    redis = spawn("redis", redis_cmd)
    for k in ("a1", "a2", "slow", "app", "ws", "fpm", "redis"):
        wait_port(ports[k])
    conf = os.path.join(WORK, "sluice.conf")
    with open(conf, "w") as f:
        f.write(config(ports, 1))
    sluice = spawn("sluice", [SLUICE, "run", "-c", conf])
    wait_port(ports["plain"])
    wait_port(ports["tls"])
    print(f"soak: {MINUTES:g} minutes, sluice pid {sluice.pid}, files in {WORK}", flush=True)

    samples = []
    plain, tls = f"http://127.0.0.1:{ports['plain']}", f"https://127.0.0.1:{ports['tls']}"
    load = [
        (h2load, ("HTTP/1.1 keep-alive", ["--h1", "-c", "4", "--rps", "40", plain + "/"])),
        (h2load, ("h2c", ["-c", "2", "-m", "4", "--rps", "40", plain + "/"])),
        (h2load, ("h2 over TLS", ["-c", "2", "-m", "4", "--rps", "40", tls + "/"])),
        (h2load, ("HTTP/1.1 over TLS", ["--h1", "-c", "2", "--rps", "40", tls + "/"])),
        (ab, ("new connection per request", plain + "/")),
        (ab, ("FastCGI (php-fpm)", plain + "/php/hello.php")),
        (uploads, (ports["plain"],)),
        (sse, (ports["plain"],)),
        (sse, (ports["plain"],)),
        (websockets, (ports["plain"],)),
        (named, (ports["plain"],)),
    ]
    threads = [threading.Thread(target=sample, args=(sluice.pid, samples), daemon=True)]
    threads += [threading.Thread(target=f, args=a, daemon=True) for f, a in load]
    threads.append(threading.Thread(target=faults_loop, args=(ports, backends, dns, redis_cmd, redis), daemon=True))
    for t in threads:
        t.start()
    while time.time() < END:
        time.sleep(min(60, max(0.1, END - time.time())))
        done = sum(v[0] for v in totals.values())
        bad = sum(v[1] for v in totals.values())
        last = samples[-1] if samples else (0, 0, 0)
        print(f"  {int(time.time() - T0):5d} s: {done} done, {bad} failed; RSS {last[1]} KiB, {last[2]} fds", flush=True)
    for t in threads[1:]:
        t.join(timeout=60)
    alive = sluice.poll() is None
    report(samples, alive, ports)


def flat(samples, col):
    n = len(samples)
    second = [s[col] for s in samples[n // 5 : 2 * n // 5]]
    last = [s[col] for s in samples[4 * n // 5 :]]
    a, b = sum(second) / len(second), sum(last) / len(last)
    return a, b, (b - a) / a * 100


def explained(ports):
    """What the injected faults explain, by the words of sluice's messages: the rate
    limiter's Redis store, and the two backends that get killed, by their ports."""
    killed = f"127\\.0\\.0\\.1:({ports['a1']}|{ports['a2']})\\b"
    return [
        (re.compile(rf"rate_limit store redis://127\.0\.0\.1:{ports['redis']}: "), "Redis stopped (or slower than 50 ms on the busy machine)"),
        (re.compile(rf"{killed} failed"), "a backend killed"),
    ]


def report(samples, alive, ports):
    lines = []
    say = lambda s="": (print(s), lines.append(s))
    say(f"soak: {MINUTES:g} minutes on {os.cpu_count()} cores; sluice {'still running' if alive else 'EXITED'}")
    say()
    say(f"{'load':32} {'done':>10} {'failed':>7}")
    for k, (d, f) in sorted(totals.items()):
        say(f"{k:32} {d:>10} {f:>7}")
    failed = sum(v[1] for v in totals.values())
    say()
    say(f"faults injected: {len(faults)}")
    kinds = {}
    for _, w in faults:
        key = re.sub(r"\d+(\.\d+)*", "N", w)
        kinds[key] = kinds.get(key, 0) + 1
    for k, n in sorted(kinds.items()):
        say(f"  {n:4d} × {k}")
    if failures:
        say()
        say("failures:")
        for f in failures[:40]:
            say(f"  at {f[0]} s: {f[1]}: {f[2]} ({f[3]})")
    rss = flat(samples, 1)
    fds = flat(samples, 2)
    say()
    say(f"RSS: {rss[0]:.0f} KiB in the second fifth, {rss[1]:.0f} KiB in the last ({rss[2]:+.1f} %)")
    say(f"open descriptors: {fds[0]:.1f} then {fds[1]:.1f} ({fds[2]:+.1f} %)")
    warn = []
    with open(os.path.join(WORK, "sluice.log"), errors="replace") as f:
        for line in f:
            if " WARN " in line or " ERROR " in line:
                warn.append(line.rstrip())
    unexplained = []
    why = {}
    for w in warn:
        for rx, reason in explained(ports):
            if rx.search(w):
                why[reason] = why.get(reason, 0) + 1
                break
        else:
            unexplained.append(w)
    say(f"log lines above INFO: {len(warn)}; " + ", ".join(f"{n} explained by {r}" for r, n in why.items()) + f"; {len(unexplained)} unexplained")
    for w in unexplained[:20]:
        say("  " + w)
    errors = [w for w in warn if " ERROR " in w]
    # Descriptors are a few dozen: 5 % is two or three, which the load's own phases
    # move (connections open and close); three either way is noise, not a leak.
    fds_flat = abs(fds[2]) <= 5 or abs(fds[1] - fds[0]) <= 3
    ok = alive and failed == 0 and abs(rss[2]) <= 5 and fds_flat and not unexplained and not errors
    say()
    say("soak: PASSED" if ok else "soak: FAILED")
    with open(os.path.join(ROOT, "bench", "soak-results.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    data = os.path.join(WORK, "samples.dat")
    with open(data, "w") as f:
        for t, r, d in samples:
            f.write(f"{t / 60:.3f} {r / 1024:.2f} {d}\n")
    marks = "".join(f"set arrow from {t / 60:.3f}, graph 0 to {t / 60:.3f}, graph 0.04 nohead lc rgb '#c04040'\n"
                    for t, w in faults if w.startswith("killed"))
    plot = f"""set terminal pngcairo size 1000,420 font ',10'
set output '{os.path.join(ROOT, "docs", "soak.png")}'
set title 'sluice under the soak: RSS and open descriptors ({MINUTES:g} min; red ticks: a backend killed)'
set xlabel 'minutes'
set ylabel 'RSS (MiB)'
set y2label 'open descriptors'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set key bottom right
set grid
{marks}plot '{data}' using 1:2 with lines lw 2 title 'RSS (MiB)', '' using 1:3 axes x1y2 with lines lw 2 title 'open descriptors'
"""
    try:
        subprocess.run(["gnuplot"], input=plot, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"soak: no graph: {e}")
    stop_all()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
