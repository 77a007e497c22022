"""An OpenAI-compatible front for a served ``Model``: ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/models``, so OpenAI clients (and vLLM's, aiperf's,
``servescope bench --openai``) call a ported model unchanged.

    app = servescope.serve(Generate(), openai="my-model")      # or: servescope serve ... --openai my-model

Each OpenAI request becomes the model's own payload (``Model.openai_request``: by default
``{"prompt": ..., "max_tokens": ...}``, a chat's messages joined by ``Model.chat_prompt``) and
goes through the runtime like any other: batched, its stages timed (``Server-Timing``), its
errors answered. What the model streams back (each chunk ``postprocess`` returns; its text by
``Model.openai_text``) is sent as OpenAI's events: for chat a first event with the role, a
``delta.content`` per chunk, a last one with the ``finish_reason``, with
``stream_options.include_usage`` an event with ``usage``, then ``data: [DONE]``. Without
``"stream": true`` the chunks are joined into one answer with its ``usage``. A model that
answers whole (no generator) gives one chunk. ``usage``: each chunk with text is one output
token (a decoder yields a step per token), the prompt counted by ``Model.count_tokens`` (the
model's own ``tokenizer`` when it has one; left out when it has none).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .asgi import respond

__all__ = ["OpenAIFront"]

SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})


class OpenAIFront:
    """The ``/v1`` routes of a ``ServeApp`` (``app.openai``), the model named ``name``."""

    def __init__(self, app: Any, name: str) -> None:
        self.app, self.name = app, name
        self._ids = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path == "/v1/models" and method == "GET":
            data = [{"id": self.name, "object": "model", "created": 0, "owned_by": "servescope"}]
            await respond(send, 200, orjson.dumps({"object": "list", "data": data}))
            return
        api = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(path)
        if api is None:
            await respond(send, 404, openai_error(404, f"no route {path}: POST /v1/completions, /v1/chat/completions, GET /v1/models", "not_found"))
            return
        if method != "POST":
            await respond(send, 405, openai_error(405, f"use POST {path}"), [(b"allow", b"POST")])
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.app.max_body_bytes:
                await respond(send, 413, openai_error(413, f"request body over {self.app.max_body_bytes} bytes"))
                return
            if not message.get("more_body"):
                break
        try:
            request = orjson.loads(body)
            if not isinstance(request, dict):
                raise ValueError("expected a JSON object")
            payload, prompt = self._payload(request, api)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
            why = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            await respond(send, 400, openai_error(400, f"invalid request: {why}"))
            return
        turn = _Answer(self, api, request, prompt, send)
        await self.app._predict(_inner_scope(scope), _once(orjson.dumps(payload), receive), turn.send)

    def _payload(self, request: dict[str, Any], api: str) -> tuple[Any, str]:
        model = self.app.model
        if api == "chat":
            messages = request["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            prompt = model.chat_prompt(messages)
        else:
            prompt = request["prompt"]
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise ValueError("prompt must be one text (send several prompts as several requests)")
        return model.openai_request(request, prompt), prompt

    def next_id(self) -> str:
        self._ids += 1
        return f"{self.app._id_prefix}-{self._ids:x}"


def _inner_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """The request as the runtime's own route takes it: JSON lines for a stream, no trailers."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in (b"accept", b"te", b"content-length")]
    return {**scope, "headers": [*headers, (b"accept", b"application/x-ndjson")], "extensions": {}}


def _once(body: bytes, receive: Any) -> Any:
    """The body once, then the client's own messages (its disconnect stops the model's work)."""
    sent = False

    async def inner() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner


class _Answer:
    """One OpenAI answer, made from what the runtime sends: its status and head, then JSON
    lines (a stream) or one JSON body (a whole answer)."""

    def __init__(self, front: OpenAIFront, api: str, request: dict[str, Any], prompt: str, send: Any) -> None:
        self.front, self.api, self.request, self.prompt, self.out = front, api, request, prompt, send
        self.stream = bool(request.get("stream"))
        self.usage_asked = bool((request.get("stream_options") or {}).get("include_usage"))
        self.max_tokens = next((request[k] for k in ("max_tokens", "max_completion_tokens") if request.get(k) is not None), None)
        self.id = ("chatcmpl-" if api == "chat" else "cmpl-") + front.next_id()
        self.created = int(time.time())
        self.status = 0
        self.timing: list[tuple[bytes, bytes]] = []
        self.plain = False  # the model answered whole: one JSON body
        self.rest = b""
        self.pieces: list[str] = []
        self.failed: bytes | None = None
        self.started = False

    # -- what the runtime sends ------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            headers = dict(message.get("headers") or [])
            self.timing = [(b"server-timing", headers[b"server-timing"])] if b"server-timing" in headers else []
            self.plain = headers.get(b"content-type", b"").startswith(b"application/json")
            if self.status == 200 and self.stream:
                await self.out({"type": "http.response.start", "status": 200, "headers": [*SSE, *self.timing]})
                self.started = True
                if self.api == "chat":
                    await self._event({"role": "assistant", "content": ""}, None)
        elif kind == "http.response.body":
            await self._body(message.get("body", b""), bool(message.get("more_body")))

    async def _body(self, data: bytes, more: bool) -> None:
        if self.status != 200:
            self.rest += data
            if not more:
                await self._error()
            return
        self.rest += data
        if self.plain:
            if not more:
                await self._chunk(orjson.loads(self.rest or b"null"))
                self.rest = b""
        else:
            *lines, self.rest = self.rest.split(b"\n")
            for line in lines:
                if line.strip():
                    await self._chunk(orjson.loads(line))
        if not more:
            await self._end()

    async def _chunk(self, chunk: Any) -> None:
        if isinstance(chunk, dict) and "error" in chunk and "request_id" in chunk:  # the model failed mid-stream
            self.failed = orjson.dumps({"error": {"message": chunk["error"], "type": "server_error", "code": 500, "request_id": chunk["request_id"]}})
            return
        text = self.front.app.model.openai_text(chunk)
        if not text:
            return
        self.pieces.append(text)
        if self.stream:
            await self._event({"content": text} if self.api == "chat" else text, None)

    async def _event(self, delta: Any, finish: str | None, **more: Any) -> None:
        choice = {"index": 0, "delta": delta} if self.api == "chat" else {"index": 0, "text": delta}
        event = {
            "id": self.id, "object": "chat.completion.chunk" if self.api == "chat" else "text_completion", "created": self.created,
            "model": self.front.name, "choices": [{**choice, "finish_reason": finish}], **more,
        }  # fmt: skip
        await self.out({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n", "more_body": True})

    # -- the answer's end --------------------------------------------------------------------
    def _usage(self) -> dict[str, int]:
        model = self.front.app.model
        usage = {"completion_tokens": len(self.pieces)}  # a chunk with text per token, as a decoder yields a step each
        prompt = model.count_tokens(self.prompt)
        if prompt is not None:
            usage["prompt_tokens"] = prompt
            usage["total_tokens"] = prompt + usage["completion_tokens"]
        return usage

    def _finish(self, usage: dict[str, int]) -> str:
        n = usage["completion_tokens"]
        return "length" if isinstance(self.max_tokens, int) and n >= self.max_tokens else "stop"

    async def _end(self) -> None:
        usage = self._usage()
        finish = self._finish(usage)
        if self.stream:
            if self.failed is not None:
                await self.out({"type": "http.response.body", "body": b"data: " + self.failed + b"\n\n", "more_body": True})
            else:
                await self._event({} if self.api == "chat" else "", finish)
                if self.usage_asked:
                    event = {"id": self.id, "object": "chat.completion.chunk" if self.api == "chat" else "text_completion",
                             "created": self.created, "model": self.front.name, "choices": [], "usage": usage}  # fmt: skip
                    await self.out({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n", "more_body": True})
            await self.out({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            return
        if self.failed is not None:
            await respond(self.out, 500, self.failed, [(b"content-type", b"application/json"), *self.timing])
            return
        text = "".join(self.pieces)
        if self.api == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        answer = {
            "id": self.id, "object": "chat.completion" if self.api == "chat" else "text_completion", "created": self.created,
            "model": self.front.name, "choices": [choice], "usage": usage,
        }  # fmt: skip
        await respond(self.out, 200, orjson.dumps(answer), [(b"content-type", b"application/json"), *self.timing])

    async def _error(self) -> None:
        """The runtime refused or failed the request: its status, in OpenAI's error shape (an
        invalid payload, 422 from the runtime, is OpenAI's 400)."""
        try:
            said = orjson.loads(self.rest).get("error") or "request failed"
        except (orjson.JSONDecodeError, AttributeError):
            said = "request failed"
        status = 400 if self.status == 422 else self.status
        kind = "invalid_request_error" if status < 500 else "server_error"
        await respond(self.out, status, openai_error(status, str(said), kind), [(b"content-type", b"application/json"), *self.timing])

