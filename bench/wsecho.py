#!/usr/bin/env python3
"""WebSocket echo for the benchmark (python3-websockets, no compression).

    wsecho.py server PORT                      echo every message back
    wsecho.py client URL CONNS SECONDS SIZE    CONNS sockets, each sending a SIZE-byte
                                               binary message and awaiting its echo in a
                                               loop; prints JSON: requests (messages
                                               echoed), rps, p50 and p99 in µs
"""

import asyncio
import json
import sys
import time

import websockets


async def serve(port):
    async def echo(ws, path=None):
        try:
            async for m in ws:
                await ws.send(m)
        except websockets.ConnectionClosed:
            pass

    async with websockets.serve(echo, "127.0.0.1", port, compression=None, max_size=None):
        await asyncio.Future()


async def client(url, conns, seconds, size):
    payload = b"x" * size
    lat = []
    stop = time.monotonic() + seconds

    async def one():
        async with websockets.connect(url, compression=None, max_size=None) as ws:
            while time.monotonic() < stop:
                t = time.perf_counter()
                await ws.send(payload)
                got = await ws.recv()
                lat.append(time.perf_counter() - t)
                if len(got) != size:
                    sys.exit("wsecho: the echo came back wrong")

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(conns)))
    took = time.monotonic() - t0
    lat.sort()
    n = len(lat)
    print(json.dumps({"requests": n, "rps": n / took, "p50": lat[n // 2] * 1e6, "p99": lat[min(n - 1, n * 99 // 100)] * 1e6}))


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        asyncio.run(client(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])))
