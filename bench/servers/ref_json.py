"""#25's reference JSON server: a plain (not streamed) endpoint whose timing is known and which
records its own figures, so a load tester's numbers can be checked against the server's.

    uvicorn ref_json:app --host 127.0.0.1 --port 8000    (from bench/servers/)
    REF_STALL_EVERY_S=5 REF_STALL_S=1 uvicorn ref_json:app ...   (the stalling one)

One worker (capacity 1: requests wait their turn in a first-come queue), 20 ms a request
(``SERVICE_S``). With ``REF_STALL_EVERY_S`` the worker is also taken away for ``REF_STALL_S``
(1 s) every that many seconds, counted from the first request after 2 s without any (so from
the start of each load test), so every tool meets the stalls at the same times into its run,
however long it takes to start: the requests
that arrive meanwhile are accepted and wait, so their wait is in the server's own figures.
This is a stall of the worker (a lock held), not of the event loop: a blocked loop would not
see the requests that arrive during it, and the server's figures would miss the stall as a
closed-loop client does.

Routes: ``POST /predict`` (any body: ``{"label": ..., "score": ...}``), ``POST /v1/embeddings``
(OpenAI's format, so tools that speak only OpenAI APIs can load it), ``GET /v1/models``,
``GET /health``, ``POST /reset``, ``GET /stats`` (``records``: ``arrival``, ``start`` (the worker
taken), ``end`` (the answer handed to the transport), ``complete``), on ``perf_counter``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import orjson
from ref_streamer import _json, _read_body  # (this folder: the servers run from it)

SERVICE_S = 0.020
STALL_EVERY_S = float(os.environ.get("REF_STALL_EVERY_S", "0"))
STALL_S = float(os.environ.get("REF_STALL_S", "1"))
MODEL = "ref-embed"

_worker = asyncio.Lock()
_records: list[dict[str, Any]] = []
_stalls: list[list[float]] = []
_last = [float("-inf")]  # the last request's arrival: a request after IDLE_S without any restarts the stall clock
IDLE_S = 2.0
_staller: list[asyncio.Task[None]] = []


async def _stall_loop(epoch: float) -> None:
    k = 1
    while True:
        await asyncio.sleep(max(0.0, epoch + k * STALL_EVERY_S - time.perf_counter()))
        async with _worker:
            t0 = time.perf_counter()
            await asyncio.sleep(max(0.0, t0 + STALL_S - time.perf_counter()))
            _stalls.append([t0, time.perf_counter()])
        k += 1


def _start_stalls(epoch: float) -> None:
    """Stalls every STALL_EVERY_S from ``epoch``: the first request after a reset, so each load
    tester meets them at the same times into its run, however long it takes to start."""
    for task in _staller:
        task.cancel()
    _staller.clear()
    _staller.append(asyncio.ensure_future(_stall_loop(epoch)))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        for task in _staller:
            task.cancel()
        await send({"type": "lifespan.shutdown.complete"})
        return
    arrival = time.perf_counter()
    path, method = scope["path"], scope["method"]
    body = await _read_body(receive) if method == "POST" else b""
    if path == "/health":
        return await _json(send, 200, {"ok": True})
    if path == "/v1/models":
        return await _json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
    if path == "/stats":
        return await _json(send, 200, {"service_ms": SERVICE_S * 1e3, "stall_every_s": STALL_EVERY_S, "stall_s": STALL_S, "stalls": _stalls, "records": _records})
    if path == "/reset" and method == "POST":
        _records.clear()
        _stalls.clear()
        for task in _staller:
            task.cancel()
        _staller.clear()
        _last[0] = float("-inf")
        return await _json(send, 200, {"ok": True})
    if path not in ("/predict", "/v1/embeddings") or method != "POST":
        return await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})
    if STALL_EVERY_S > 0 and arrival - _last[0] > IDLE_S:
        _start_stalls(arrival)
    _last[0] = arrival
    rec: dict[str, Any] = {"arrival": arrival, "complete": False}
    _records.append(rec)
    async with _worker:
        rec["start"] = time.perf_counter()
        await asyncio.sleep(max(0.0, rec["start"] + SERVICE_S - time.perf_counter()))
    if path == "/v1/embeddings":
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            req = {}
        inputs = req.get("input", "")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        n = sum(len(str(i).split()) for i in inputs)
        data = [{"object": "embedding", "index": i, "embedding": [0.0] * 8} for i in range(len(inputs))]
        await _json(send, 200, {"object": "list", "data": data, "model": req.get("model", MODEL), "usage": {"prompt_tokens": n, "total_tokens": n}})
    else:
        await _json(send, 200, {"label": "positive", "score": 0.93})
    rec["end"], rec["complete"] = time.perf_counter(), True
