"""Small ASGI apps for end-to-end tests: a fixed delay, a one-time stall, Server-Timing,
token streams (plain, and OpenAI-compatible)."""

from __future__ import annotations

import asyncio
import json
import os
import time

DELAY_S = float(os.environ.get("SERVESCOPE_TEST_DELAY", "0.02"))
#: /one-at-a-time's service time: capacity 1 / SERVICE_S requests/s
SERVICE_S = float(os.environ.get("SERVESCOPE_TEST_SERVICE", "0.01"))


async def stream(scope, send):
    """``/stream?ttft_ms=100&gap_ms=20&tokens=10&sse=1``: the head at once, the first token
    ``ttft_ms`` later, then one every ``gap_ms`` (on absolute deadlines, so timer slack does not
    add up); chunked, or as Server-Sent Events (``data: tok<k>`` after a comment line; every
    event is a token, no ``[DONE]``). ``stall_ms=1000``: once, the whole server stalls that long
    (a blocking sleep on its event loop: every stream in flight waits) half-way through a
    stream that starts 1 s or more after the first such request.
    """
    q = dict(kv.split("=", 1) for kv in scope["query_string"].decode().split("&") if "=" in kv)
    ttft, gap = float(q.get("ttft_ms", 100)) / 1e3, float(q.get("gap_ms", 20)) / 1e3
    tokens, sse, stall = int(q.get("tokens", 10)), q.get("sse") == "1", float(q.get("stall_ms", 0)) / 1e3
    ctype = b"text/event-stream" if sse else b"text/plain"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
    t0 = time.perf_counter()
    state = app.__dict__.setdefault("stream_stall", {"first": None, "done": False})
    if stall and state["first"] is None:
        state["first"] = t0
    for k in range(tokens):
        due = t0 + ttft + k * gap
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        if stall and k == tokens // 2 and not state["done"] and time.perf_counter() - state["first"] > 1.0:
            state["done"] = True
            time.sleep(stall)
            t0 += stall  # the later tokens keep their pace after the stall
        body = b": keep-alive\ndata: tok%d\n\n" % k if sse else b"tok%d " % k
        await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def openai(scope, body, send):
    """An OpenAI-compatible server: ``/v1/chat/completions`` and ``/v1/completions`` answer
    with ``max_tokens`` tokens (default 16), the first ``ttft_ms`` after the request (query,
    default 100), then one every ``gap_ms`` (default 20), on absolute deadlines. Streamed as
    OpenAI streams: a chat stream's role event comes at once, with empty content (not a
    token); ``"usage": null`` in each event, and with ``stream_options.include_usage`` a last
    event with ``usage`` and no choices (``usage=0`` in the query: never); ``per_event=2``
    puts two tokens in each event; ``eos=N`` ends every answer after N tokens unless the request
    says ``"ignore_eos": true``. ``"stream": false``: one JSON answer with its usage, when
    the last token is due. ``/v1/models`` lists ``test-model``."""
    q = dict(kv.split("=", 1) for kv in scope["query_string"].decode().split("&") if "=" in kv)
    if scope["path"] == "/v1/models":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"object": "list", "data": [{"id": "test-model", "object": "model"}]}'})
        return
    req = json.loads(body)
    chat = scope["path"] == "/v1/chat/completions"
    ttft, gap = float(q.get("ttft_ms", 100)) / 1e3, float(q.get("gap_ms", 20)) / 1e3
    tokens, per_event = int(req.get("max_tokens", 16)), int(q.get("per_event", 1))
    if "eos" in q and not req.get("ignore_eos"):  # the model's own end of answer after eos tokens
        tokens = min(tokens, int(q["eos"]))
    prompt = " ".join(m["content"] for m in req["messages"]) if chat else req["prompt"]
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens, "total_tokens": len(prompt.split()) + tokens}
    with_usage = (req.get("stream_options") or {}).get("include_usage") and q.get("usage") != "0"
    kind = "chat.completion.chunk" if chat else "text_completion"
    t0 = time.perf_counter()

    async def until(k):
        await asyncio.sleep(max(0.0, t0 + ttft + k * gap - time.perf_counter()))

    def choice(text, finish=None):
        out = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        return {**out, "finish_reason": finish}

    if not req.get("stream"):
        events = -(-tokens // per_event)
        await until(events - 1)
        text = "".join(f"tok{k} " for k in range(tokens))
        msg = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat else choice(text, "length")
        answer = {"id": "x", "object": "chat.completion" if chat else "text_completion", "model": req["model"], "choices": [msg], "usage": usage}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})

    async def event(data):
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(data).encode() + b"\n\n", "more_body": True})

    base = {"id": "x", "object": kind, "model": req["model"]}
    null = {"usage": None} if with_usage else {}
    if chat:  # the role first, at once: not a token
        await event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], **null})
    for e, k in enumerate(range(0, tokens, per_event)):
        await until(e)
        text = "".join(f"tok{j} " for j in range(k, min(k + per_event, tokens)))
        await event({**base, "choices": [choice(text)], **null})
    await event({**base, "choices": [{**choice(""), "finish_reason": "length"}], **null})  # empty: not a token
    if with_usage:
        await event({**base, "choices": [], "usage": usage})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def app(scope, receive, send):
    """``/delay`` sleeps DELAY_S and says so in Server-Timing; ``/stall`` stalls the whole
    server (a blocking sleep on the event loop) once, 1 s after its first request; ``/fast``
    answers at once; ``/error`` answers 503; ``/reject`` answers 422 with a body and Server-Timing;
    ``/stream`` streams tokens (``stream``); ``/one-at-a-time`` serves one request at a time;
    ``/v1/...`` is an OpenAI-compatible server (``openai``)."""
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
    elif path == "/stream":
        await stream(scope, send)
        return
    elif path.startswith("/v1/"):
        await openai(scope, body, send)
        return
    elif path == "/one-at-a-time":  # a fixed service rate: one request at a time, SERVICE_S each
        time.sleep(SERVICE_S)  # blocks the loop: the next request waits, as on a busy worker
    elif path == "/error":
        status = 503
    elif path == "/reject":  # an endpoint that refuses the payload, with its timing, as servescope.serve does
        await send({"type": "http.response.start", "status": 422, "headers": [*headers, (b"server-timing", b"validate;dur=0.050, total;dur=0.060")]})
        await send({"type": "http.response.body", "body": b'{"error": "invalid payload: missing field \'text\'"}'})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})
