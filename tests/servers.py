"""Small ASGI apps for end-to-end tests: a fixed delay, a one-time stall, Server-Timing."""

from __future__ import annotations

import asyncio
import os
import time

DELAY_S = float(os.environ.get("SERVESCOPE_TEST_DELAY", "0.02"))


async def app(scope, receive, send):
    """``/delay`` sleeps DELAY_S and says so in Server-Timing; ``/stall`` stalls the whole
    server (a blocking sleep on the event loop) once, 1 s after its first request; ``/fast``
    answers at once; ``/error`` answers 503; ``/reject`` answers 422 with a body and Server-Timing."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    path = scope["path"]
    headers = [(b"content-type", b"application/json")]
    status = 200
    if path == "/delay":
        t0 = time.perf_counter()
        await asyncio.sleep(DELAY_S)
        infer = (time.perf_counter() - t0) * 1000
        headers.append((b"server-timing", f"infer;dur={infer:.3f}, total;dur={infer + 0.01:.3f}".encode()))
    elif path == "/stall":
        state = app.__dict__.setdefault("stall", {"first": None, "done": False})
        now = time.perf_counter()
        if state["first"] is None:
            state["first"] = now
        if not state["done"] and now - state["first"] > 1.0:
            state["done"] = True
            time.sleep(0.5)  # blocks the loop: every request in flight or arriving waits
    elif path == "/error":
        status = 503
    elif path == "/reject":  # an endpoint that refuses the payload, with its timing, as servescope.serve does
        await send({"type": "http.response.start", "status": 422, "headers": [*headers, (b"server-timing", b"validate;dur=0.050, total;dur=0.060")]})
        await send({"type": "http.response.body", "body": b'{"error": "invalid payload: missing field \'text\'"}'})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})
