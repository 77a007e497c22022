"""An ASGI app that answers the way a broken or hostile server does, for end-to-end tests of
what servescope does with what it receives (bench, ``servescope report URL``)."""

from __future__ import annotations

import asyncio
import os

import orjson

#: How long /drip waits between two bytes (seconds).
DRIP_S = float(os.environ.get("SERVESCOPE_TEST_DRIP_S", "0.5"))


def _report(stages: int = 1, **fields: object) -> bytes:
    names = {f"s{i}": {"count": 1, "mean_ms": 1.0, "p50_ms": 1.0, "share": 0.1} for i in range(stages)}
    data = {
        "schema": "servescope.report/1",
        "latency": {"count": 1, "mean_ms": 2.0, "p50_ms": 2.0, "p90_ms": 2.0, "p95_ms": 2.0, "p99_ms": 2.0, "max_ms": 2.0},
        "stages": names,
        "findings": [],
        **fields,
    }
    return orjson.dumps(data)


async def app(scope, receive, send):
    """``/big-header`` sends a 1 MB header; ``/many-timing`` 20,000 Server-Timing lines;
    ``/huge-dur`` a Server-Timing duration of 1e300 ms; ``/report`` a small valid report;
    ``/big`` a 16 MB answer (with its length), ``/big-chunked`` the same without one;
    ``/drip`` a byte every DRIP_S seconds, never ending; ``/to-ftp`` a redirect to ftp://;
    ``/to-report`` a redirect to /report; ``/stages`` a report of 100,000 stages."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    path = scope["path"]
    headers = [(b"content-type", b"application/json")]
    status, body = 200, b'{"ok": true}'
    if path == "/big-header":
        headers.append((b"x-junk", b"j" * 1_000_000))
        headers.append((b"server-timing", b"infer;dur=1, total;dur=1.5"))
    elif path == "/big-timing":
        headers.append((b"server-timing", b", ".join([b"a;dur=0.001"] * 100_000)))
    elif path == "/many-timing":
        headers += [(b"server-timing", b"a;dur=0.001")] * 20_000
    elif path == "/huge-dur":
        headers.append((b"server-timing", b"infer;dur=1e300, total;dur=1e13"))
    elif path == "/report":
        body = _report()
    elif path == "/stages":
        body = _report(100_000)
    elif path in ("/big", "/big-chunked"):
        chunk = b" " * (1 << 20)
        if path == "/big":
            headers.append((b"content-length", str(16 << 20).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(16):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    elif path == "/drip":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while True:  # until the client leaves (uvicorn then fails the send)
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await asyncio.sleep(DRIP_S)
    elif path == "/to-ftp":
        status, headers = 302, [(b"location", b"ftp://127.0.0.1/report")]
    elif path == "/to-report":
        status, headers = 302, [(b"location", b"/report")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
