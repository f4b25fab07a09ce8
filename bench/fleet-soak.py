#!/usr/bin/env python3
"""A fleet under load: three sluice instances follow one Redis channel while a new
revision is published every 30 s; every request must succeed.

    bench/fleet-soak.py [MINUTES] [SLUICE]    (3 minutes, target/release/sluice)

Each instance gets keep-alive requests from two client threads and new-connection
requests from a third, all the run long. Every 30 s `sluice publish` sends a changed
config (the pool's `X-Revision` answer header and its timeout change); each instance
must apply it (its answers carry the new revision within 2 s) without failing one
request. Prints the totals and writes bench/fleet-soak-results.txt. Needs
redis-server.
"""

import http.client
import http.server
import os
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINUTES = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
SLUICE = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target", "release", "sluice")
WORK = tempfile.mkdtemp(prefix="sluice-fleet-")
procs = []
lock = threading.Lock()
done = {}
failed = []
stop = threading.Event()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"fleet-soak: nothing listens on {port}")


class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def count(name, ok, why=""):
    with lock:
        done[name] = done.get(name, 0) + 1
        if not ok:
            failed.append((round(time.time() - T0, 1), name, why))


def keepalive(name, port, seen):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        try:
            conn.request("GET", "/")
            r = conn.getresponse()
            r.read()
            seen[name] = r.getheader("X-Revision")
            count(name, r.status == 200, f"status {r.status}")
        except Exception as e:  # noqa: BLE001 - every failure is counted
            count(name, False, repr(e))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def fresh(name, port):
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/", headers={"Connection": "close"})
            r = conn.getresponse()
            r.read()
            conn.close()
            count(name + " (new conn)", r.status == 200, f"status {r.status}")
        except Exception as e:  # noqa: BLE001
            count(name + " (new conn)", False, repr(e))


def publish(redis_url, n, backend):
    main = os.path.join(WORK, "pub", "main.conf")
    os.makedirs(os.path.dirname(main), exist_ok=True)
    with open(main, "w") as f:
        f.write(
            "global { admin off }\nlisten 127.0.0.1:{$FLEET_PORT:1}\n"
            f"site * {{ proxy 127.0.0.1:{backend} {{ timeout {10 + n}s; header_down X-Revision \"{n}\" }} }}\n"
        )
    out = subprocess.run([SLUICE, "publish", "-c", main, "--to", redis_url], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fleet-soak: publish failed: {out.stderr}")


def main():
    global T0
    backend = free_port()
    app = Server(("127.0.0.1", backend), App)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--requirepass", "soak-pw"], stdout=subprocess.DEVNULL))
    wait_port(rport)
    url = f"redis://:soak-pw@127.0.0.1:{rport}"
    publish(url, 1, backend)
    ports = {}
    for name in ["edge-1", "edge-2", "edge-3"]:
        port = free_port()
        conf = os.path.join(WORK, name + ".conf")
        with open(conf, "w") as f:
            f.write(f"global {{ admin off; fleet {url} {{ name {name} }} }}\n"
                    "listen 127.0.0.1:{$FLEET_PORT}\nsite * { respond 503 }\n")
        log = open(os.path.join(WORK, name + ".log"), "wb")
        env = dict(os.environ, FLEET_PORT=str(port))
        procs.append(subprocess.Popen([SLUICE, "run", "-c", conf], stderr=log, env=env))
        wait_port(port)
        ports[name] = port
    T0 = time.time()
    seen = {}
    threads = []
    for name, port in ports.items():
        threads += [threading.Thread(target=keepalive, args=(name, port, seen)) for _ in range(2)]
        threads.append(threading.Thread(target=fresh, args=(name, port)))
    for t in threads:
        t.start()
    end = T0 + MINUTES * 60
    revision, late = 1, []
    while time.time() + 30 < end:
        time.sleep(30)
        revision += 1
        publish(url, revision, backend)
        t = time.time()
        while any(seen.get(n) != str(revision) for n in ports) and time.time() - t < 5:
            time.sleep(0.02)
        took = time.time() - t
        if took > 2:
            late.append((revision, round(took, 2), dict(seen)))
    time.sleep(max(0, end - time.time()))
    stop.set()
    for t in threads:
        t.join()
    for p in procs:
        p.terminate()
    app.shutdown()
    lines = [f"fleet soak: {MINUTES:g} min, 3 instances, {revision - 1} publishes (every 30 s)"]
    for name in sorted(done):
        lines.append(f"{name:<24} {done[name]:>9} requests, {sum(1 for f in failed if f[1] == name)} failed")
    lines.append(f"publishes applied by all three later than 2 s: {len(late)} {late if late else ''}")
    lines += [f"  failed at {t}s: {n}: {w}" for t, n, w in failed[:20]]
    ok = not failed and not late
    lines.append("fleet soak: " + ("PASSED" if ok else "FAILED"))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(ROOT, "bench", "fleet-soak-results.txt"), "w") as f:
        f.write(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
