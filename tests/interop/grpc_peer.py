"""A gRPC server and client from grpcio, for tests/grpc.rs: programs nobody on the
project wrote, on both sides of sluice. No generated code: the methods take and give raw
bytes (`generic` handlers), and health checking is grpcio-health-checking's servicer.

    grpc_peer.py serve [--tls CERT KEY]       prints "port N", serves until stdin closes
    grpc_peer.py call TARGET CASE [--tls CA NAME] [--authority HOST]
                                              runs one case, prints one JSON line
    grpc_peer.py webcall URL CASE             the same through sonora's gRPC-Web client
"""
import json
import sys
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "test.Echo"


def unary(request, context):
    text = request.decode("utf-8", "replace")
    if text.startswith("abort:"):
        # "abort:CODE:DETAILS": custom trailers, one of them binary.
        _, code, details = text.split(":", 2)
        context.set_trailing_metadata((("x-why", "asked"), ("x-detail-bin", b"\x00\x01\xff")))
        context.abort(grpc.StatusCode[code], details)
    if text.startswith("sleep:"):
        left = context.time_remaining()
        time.sleep(float(text[6:]))
        return json.dumps({"left": left}).encode()
    if text == "metadata":
        md = {k: v for k, v in context.invocation_metadata() if not k.endswith("-bin")}
        return json.dumps(md).encode()
    return request


def server_stream(request, context):
    for i in range(int(request.decode())):
        yield b"msg %d" % i


def client_stream(request_iterator, context):
    # Headers first, then read: the case where a proxy that waits for the request body
    # to end before it relays the response head hangs.
    context.send_initial_metadata((("x-early", "yes"),))
    total = b""
    for m in request_iterator:
        total += m
    return b"got %d bytes" % len(total)


def bidi(request_iterator, context):
    for m in request_iterator:
        yield b"echo " + m


def serve(args):
    server = grpc.server(
        __import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=16),
        options=[("grpc.max_receive_message_length", 16 << 20),
                 ("grpc.max_send_message_length", 16 << 20)],
    )
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    hs = health.HealthServicer()
    hs.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    hs.set("test.Down", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if args and args[0] == "--tls":
        cert, key = open(args[1], "rb").read(), open(args[2], "rb").read()
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(((key, cert),)))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("port %d" % port, flush=True)
    # Health can be flipped from stdin: "down SERVICE" / "up SERVICE".
    for line in sys.stdin:
        word, _, name = line.strip().partition(" ")
        if word == "down":
            hs.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        elif word == "up":
            hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.stop(0)


def method(channel, kind, name):
    path = "/%s/%s" % (SERVICE, name)
    return getattr(channel, kind)(path)


def call(target, case, args):
    opts = [("grpc.max_receive_message_length", 16 << 20),
            ("grpc.max_send_message_length", 16 << 20)]
    if "--authority" in args:
        i = args.index("--authority")
        opts.append(("grpc.default_authority", args[i + 1]))
        args = args[:i] + args[i + 2:]
    if args and args[0] == "--tls":
        creds = grpc.ssl_channel_credentials(root_certificates=open(args[1], "rb").read())
        opts.append(("grpc.ssl_target_name_override", args[2]))
        channel = grpc.secure_channel(target, creds, options=opts)
    else:
        channel = grpc.insecure_channel(target, options=opts)
    out = {}
    try:
        out = run_case(channel, case)
    except grpc.RpcError as e:
        out = {
            "code": e.code().name,
            "details": e.details(),
            "trailers": {k: (v.hex() if isinstance(v, bytes) else v)
                         for k, v in (e.trailing_metadata() or ())},
        }
    print(json.dumps(out), flush=True)


def run_case(channel, case):
    name, _, arg = case.partition(":")
    if name == "unary":
        reply = method(channel, "unary_unary", "Unary")(arg.encode(), timeout=10)
        return {"code": "OK", "reply": reply.decode()}
    if name == "big":
        n = int(arg)
        body = bytes(range(256)) * (n // 256)
        reply = method(channel, "unary_unary", "Unary")(body, timeout=20)
        return {"code": "OK", "same": reply == body, "len": len(reply)}
    if name == "abort":
        method(channel, "unary_unary", "Unary")(("abort:" + arg).encode(), timeout=10)
        return {"code": "OK"}
    if name == "deadline":
        # "deadline:TIMEOUT:SLEEP"
        t, s = arg.split(":")
        reply = method(channel, "unary_unary", "Unary")(("sleep:" + s).encode(), timeout=float(t))
        return {"code": "OK", "reply": json.loads(reply)}
    if name == "server_stream":
        got = [m.decode() for m in method(channel, "unary_stream", "ServerStream")(arg.encode(), timeout=10)]
        return {"code": "OK", "messages": got}
    if name == "client_stream":
        call = method(channel, "stream_unary", "ClientStream")
        msgs = (b"x" * 1000 for _ in range(int(arg)))
        reply, c = call.with_call(msgs, timeout=10)
        return {"code": "OK", "reply": reply.decode(), "initial": dict(c.initial_metadata())}
    if name == "bidi":
        # Ping-pong: each message waits for its echo before the next goes, so a proxy
        # that stops the upload once the response head arrived hangs here.
        cond = threading.Condition()
        queue = []
        def requests():
            for i in range(int(arg)):
                with cond:
                    queue.append(b"m%d" % i)
                    cond.notify()
                yield b"m%d" % i
                with cond:
                    if not cond.wait_for(lambda: not queue, timeout=5):
                        return
        got = []
        for reply in method(channel, "stream_stream", "Bidi")(requests(), timeout=10):
            got.append(reply.decode())
            with cond:
                if queue:
                    queue.pop(0)
                cond.notify()
        return {"code": "OK", "messages": got}
    if name == "cancel":
        # A server stream cancelled by the client after its first message.
        it = method(channel, "unary_stream", "ServerStream")(b"1000000", timeout=10)
        first = next(it).decode()
        it.cancel()
        return {"code": "OK", "first": first}
    if name == "health":
        stub = health_pb2_grpc.HealthStub(channel)
        r = stub.Check(health_pb2.HealthCheckRequest(service=arg), timeout=10)
        return {"code": "OK", "status": health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}
    raise SystemExit("unknown case " + case)


def webcall(url, case):
    # sonora: an independent gRPC-Web client (binary, over HTTP/1.1).
    import sonora.client
    same = lambda b: b
    name, _, arg = case.partition(":")
    out = {}
    with sonora.client.insecure_web_channel(url) as channel:
        try:
            if name == "unary":
                reply = channel.unary_unary("/%s/Unary" % SERVICE, same, same)(arg.encode(), timeout=10)
                out = {"code": "OK", "reply": reply.decode()}
            elif name == "abort":
                channel.unary_unary("/%s/Unary" % SERVICE, same, same)(("abort:" + arg).encode(), timeout=10)
                out = {"code": "OK"}
            elif name == "server_stream":
                got = [m.decode() for m in channel.unary_stream("/%s/ServerStream" % SERVICE, same, same)(arg.encode(), timeout=10)]
                out = {"code": "OK", "messages": got}
            else:
                raise SystemExit("unknown case " + case)
        except grpc.RpcError as e:
            out = {"code": e.code().name, "details": e.details()}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2:])
    elif sys.argv[1] == "webcall":
        webcall(sys.argv[2], sys.argv[3])
    else:
        call(sys.argv[2], sys.argv[3], sys.argv[4:])
