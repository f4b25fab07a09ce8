"""Runs h2rs's HTTP/2 → HTTP/1 downgrade probes one by one against HOST:PORT (TLS).

h2rs stops with a traceback when the server closes the connection on a malformed
request; that is the server refusing it, so a probe that raises counts as refused
rather than ending the run. Exit status 1 when any probe reports the target as
vulnerable.

    python h2rs_probe.py HOST PORT
"""

import sys

import h2rs.h2rs as h2rs

PROBES = [
    ("H2.CL", "h2cl_detect"),
    ("H2.CL (CRLF)", "h2clcrlf_detect"),
    ("H2.TE", "h2te_detect"),
    ("H2.TE (CRLF)", "h2tecrlf_detect"),
    ("HTTP/2 request tunnelling", "h2tunnel_detect"),
]


def main():
    h2rs.hostname = sys.argv[1]
    h2rs.tlsport = int(sys.argv[2])
    h2rs.timeout = 5
    h2rs.user_agent = "sluice-ci"
    vulnerable = 0
    for name, fn in PROBES:
        try:
            hit = getattr(h2rs, fn)()
            verdict = "VULNERABLE" if hit else "not vulnerable"
        except Exception as e:  # the connection was closed on the probe
            hit = False
            verdict = f"refused ({type(e).__name__})"
        vulnerable += bool(hit)
        print(f"h2rs {name}: {verdict}")
    sys.exit(1 if vulnerable else 0)


main()
