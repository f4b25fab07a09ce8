"""An ASGI application (starlette, served by uvicorn) for tests/apps.rs: a live event
stream and a WebSocket echo."""
import asyncio

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route, WebSocketRoute


async def events(request):
    async def stream():
        for i in range(5):
            yield "data: event %d\n\n" % i
            await asyncio.sleep(0.2)

    return StreamingResponse(stream(), media_type="text/event-stream")


async def echo(ws):
    await ws.accept()
    try:
        while True:
            text = await ws.receive_text()
            await ws.send_text("echo: " + text)
    except Exception:
        pass


app = Starlette(routes=[Route("/events", events), WebSocketRoute("/ws", echo)])
