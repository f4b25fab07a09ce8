"""A WSGI application (Flask, served by gunicorn) for tests/apps.rs: an upload checked
by hash, a redirect, and the cookies it was sent."""
import hashlib

from flask import Flask, redirect, request

app = Flask(__name__)


@app.post("/upload")
def upload():
    h = hashlib.sha256()
    n = 0
    while True:
        piece = request.stream.read(1 << 16)
        if not piece:
            break
        h.update(piece)
        n += len(piece)
    return "%d %s" % (n, h.hexdigest())


@app.get("/old")
def old():
    return redirect("/new?x=1", code=301)


@app.get("/cookies")
def cookies():
    return "cookie=%s; parsed=%s" % (
        request.headers.get("Cookie", ""),
        ",".join("%s:%s" % kv for kv in sorted(request.cookies.items())),
    )
