"""#25's reference streamer: an OpenAI-compatible server whose timing is known and which
records its own figures, so a load tester's numbers can be checked against the server's.

    uvicorn ref_streamer:app --host 127.0.0.1 --port 8000    (from bench/servers/)

Each answer is ``min(max_tokens, 32)`` tokens (``TOKENS``; ``max_tokens`` or
``max_completion_tokens``, default 32). A request takes one of ``CAPACITY`` (4) slots, more wait
in a queue (first come, first served); once it holds a slot its first token is due
``FIRST_S`` (60 ms) later, then one every ``GAP_S`` (15 ms), on absolute deadlines, so the
cadence does not drift with the event loop's jitter. Each token is one event with one word
(one token in all-MiniLM-L6-v2's vocabulary, so a tool that tokenizes the text counts 32).

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``"stream": true``: SSE
``data:`` events in OpenAI's format, a chat stream's role event first, the finish event,
``usage`` in a last event when ``stream_options.include_usage``, then ``data: [DONE]``;
``"stream": false``: one JSON answer when the last token is due); ``GET /v1/models``;
``GET /health``; ``POST /reset`` forgets the records; ``GET /stats`` returns them.

The server's own figures, one record per request, on this process's ``perf_counter``:
``arrival`` (the app is called: head and body read by uvicorn), ``start`` (a slot taken),
``tokens`` (the times each token's event was handed to the transport, ``send`` returned),
``end`` (the last byte handed over), ``complete`` (false when the client went away first).
TTFT is ``tokens[0] - arrival`` (queue included), ITL the gaps between ``tokens``, E2E
``end - arrival``: what a client would see, less the network and the client's own work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

TOKENS = 32
FIRST_S = 0.060
GAP_S = 0.015
CAPACITY = 4
MODEL = "ref-model"
WORDS = "the of and to in is that for it as with was on be at by this from or an are not but".split()

_slots = asyncio.Semaphore(CAPACITY)
_records: list[dict[str, Any]] = []


async def _read_body(receive: Any) -> bytes:
    chunks, more = [], True
    while more:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    return b"".join(chunks)


async def _json(send: Any, status: int, data: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(data)})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
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
        return await _json(send, 200, {"capacity": CAPACITY, "first_ms": FIRST_S * 1e3, "gap_ms": GAP_S * 1e3, "records": _records})
    if path == "/reset" and method == "POST":
        _records.clear()
        return await _json(send, 200, {"ok": True})
    if path not in ("/v1/completions", "/v1/chat/completions") or method != "POST":
        return await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return await _json(send, 400, {"error": {"message": f"body is not JSON: {exc}"}})
    gone = asyncio.Event()

    async def watch() -> None:  # uvicorn drops what is sent after a disconnect: notice it
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        await _answer(req, path == "/v1/chat/completions", arrival, send, gone)
    finally:
        watcher.cancel()


def _text(content: Any) -> str:
    """A message's content: a string, or OpenAI's list of parts (``{"type": "text", "text": ...}``)."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


async def _answer(req: dict[str, Any], chat: bool, arrival: float, send: Any, gone: asyncio.Event) -> None:
    asked = req.get("max_tokens") or req.get("max_completion_tokens") or TOKENS
    n = max(1, min(int(asked), TOKENS))
    prompt = " ".join(_text(m.get("content")) for m in req.get("messages", [])) if chat else str(req.get("prompt", ""))
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n, "total_tokens": len(prompt.split()) + n}
    stream = bool(req.get("stream"))
    rec: dict[str, Any] = {"arrival": arrival, "stream": stream, "tokens": [], "complete": False}
    _records.append(rec)
    async with _slots:
        start = rec["start"] = time.perf_counter()

        async def until(k: int) -> None:
            await asyncio.sleep(max(0.0, start + FIRST_S + k * GAP_S - time.perf_counter()))

        model = req.get("model", MODEL)
        if not stream:
            await until(n - 1)
            text = "".join(" " + WORDS[k % len(WORDS)] for k in range(n))
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            obj = "chat.completion" if chat else "text_completion"
            await _json(send, 200, {"id": "ref", "object": obj, "created": int(time.time()), "model": model, "choices": [choice], "usage": usage})
            rec["tokens"] = [time.perf_counter()]  # a plain answer: its one "token" is the whole answer
            rec["end"], rec["complete"] = rec["tokens"][0], not gone.is_set()
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        base = {"id": "ref", "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()), "model": model}
        with_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        null = {"usage": None} if with_usage else {}

        async def event(data: Any) -> None:
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(data) + b"\n\n", "more_body": True})

        def choice_of(text: str, finish: str | None = None) -> dict[str, Any]:
            out = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            return {**out, "finish_reason": finish}

        try:
            if chat:  # the role first, at once, with empty content: not a token
                await event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], **null})
            for k in range(n):
                await until(k)
                if gone.is_set():
                    return
                await event({**base, "choices": [choice_of(" " + WORDS[k % len(WORDS)])], **null})
                rec["tokens"].append(time.perf_counter())
            await event({**base, "choices": [choice_of("", "length")], **null})
            if with_usage:
                await event({**base, "choices": [], "usage": usage})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OSError:  # the client went away: recorded as incomplete
            return
        rec["end"], rec["complete"] = time.perf_counter(), not gone.is_set()
