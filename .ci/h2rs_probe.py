"""Runs h2rs's HTTP/2 → HTTP/1 downgrade probes one by one against HOST:PORT (TLS).

h2rs stops with a traceback when the server closes the connection on a malformed
request; that is the server refusing it, so a probe that raises counts as refused
rather than ending the run. Exit status 1 when any probe reports the target as
vulnerable.

    python h2rs_probe.py HOST PORT
"""

import ssl
import sys

import h2rs.h2rs as h2rs

# What a server closing the connection on a probe looks like from h2rs: refused. Any
# other exception is h2rs failing to judge, and fails the run.
CLOSED = (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

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
    # First a plain request must work, or every probe below would "pass" for nothing.
    plain = h2rs.request(
        [(":method", "GET"), (":path", "/"), (":authority", h2rs.hostname), (":scheme", "https"), ("user-agent", h2rs.user_agent)],
        b"",
    )
    status = dict(plain.get("response_headers") or []).get(b":status")
    if status != b"200":
        print(f"h2rs: a plain HTTP/2 GET did not get 200 ({plain}); cannot judge")
        sys.exit(1)
    bad = 0
    for name, fn in PROBES:
        try:
            hit = getattr(h2rs, fn)()
            verdict = "VULNERABLE" if hit else "not vulnerable"
        except CLOSED as e:
            hit = False
            verdict = f"refused (connection closed: {type(e).__name__})"
        except Exception as e:
            hit = True
            verdict = f"h2rs could not judge ({type(e).__name__}: {e})"
        bad += bool(hit)
        print(f"h2rs {name}: {verdict}")
    sys.exit(1 if bad else 0)


main()
