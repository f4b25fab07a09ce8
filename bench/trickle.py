#!/usr/bin/env python3
"""A head trickled one byte per write must cost the proxy linear, not quadratic, CPU.

Starts `sluice run` (the binary given, default target/dist/sluice) answering
`respond ok`, trickles a 6 KiB head and then a 60 KiB head to it one byte per write
(TCP_NODELAY, a short pause between writes so each byte arrives on its own), and
reads the proxy's own CPU time (/proc/PID/task/*/schedstat, nanoseconds) around each;
the median of ROUNDS (default 3) trickles of each size.
Linear scanning: the 60 KiB head costs about 10x the 6 KiB one; quadratic: far more.

    python3 bench/trickle.py [path/to/sluice]
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/dist/sluice"
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def cpu_seconds(pid):
    """CPU time of every thread of `pid`, in seconds, to the nanosecond (schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def head(size):
    lines = ["GET / HTTP/1.1", "Host: a"]
    used = sum(len(l) + 2 for l in lines) + 2
    filler = 0
    while used < size:
        n = min(1000, size - used - 12)
        if n <= 0:
            break
        lines.append(f"X-F{filler:03d}: " + "v" * n)
        used += len(lines[-1]) + 2
        filler += 1
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle(port, data):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(len(data)):
        s.send(data[i : i + 1])
        time.sleep(0.00005)
    s.settimeout(10)
    reply = s.recv(4096)
    s.close()
    return reply.split(b"\r\n", 1)[0].decode()


def main():
    with tempfile.TemporaryDirectory() as d:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        conf = os.path.join(d, "sluice.conf")
        with open(conf, "w") as f:
            f.write(f"global {{ workers 1; admin off }}\nlisten 127.0.0.1:{port}\nsite * {{ respond ok }}\n")
        p = subprocess.Popen([BIN, "run", "-c", conf], stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            costs = {}
            for size in (6 * 1024, 60 * 1024):
                data = head(size)
                runs = []
                for _ in range(ROUNDS):
                    before = cpu_seconds(p.pid)
                    status = trickle(port, data)
                    runs.append(cpu_seconds(p.pid) - before)
                costs[size] = sorted(runs)[len(runs) // 2]
                print(f"{len(data):6d} B head, one byte per write: {costs[size]*1000:7.1f} ms CPU, median of {ROUNDS} ({status})")
            ratio = costs[60 * 1024] / costs[6 * 1024]
            print(f"60 KiB / 6 KiB: {ratio:.1f}x (linear is about 10x)")
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
