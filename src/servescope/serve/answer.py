"""A prediction's answer, once its request is read: through the batch worker (with the
deadline and the watch for a client that leaves), as one body or a stream of chunks, with
``Server-Timing`` on every response and a request id on every error, and recorded for /metrics
and /report. The ``Answering`` methods are ``ServeApp``'s (app.py), which reads the request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any

import orjson

from ..exceptions import InvalidPayload
from ..recorder import Recorder
from ..servertiming import format_ns
from .asgi import disconnected, error_body, expire, push, resolve, respond
from .batching import Batcher, Item

__all__ = ["CLIENT_LEFT", "Answering", "invalid_payload"]

log = logging.getLogger("servescope")

#: The error kind of a request whose client closed the connection before its answer was complete.
CLIENT_LEFT = "client left"


def invalid_payload(exc: BaseException, debug: bool = False) -> str:
    """What a 422 says: the field, where the exception names one (a missing key), never the
    exception's own text (it may carry secrets: a URL with its password, a path), unless
    debugging."""
    if isinstance(exc, InvalidPayload):  # written for the client by the model's author
        return f"invalid payload: {exc}"
    if debug:
        return f"invalid payload: {type(exc).__name__}: {exc}"
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], (str, int)):
        return f"invalid payload: missing field {exc.args[0]!r}"
    field = getattr(exc, "field", None)  # a validate() that raises with the field it checked
    if isinstance(field, str):
        return f"invalid payload: field {field!r} is not valid"
    return f"invalid payload: rejected by validate() ({type(exc).__name__})"


class Answering:
    """The methods of ``ServeApp`` that answer a prediction."""

    batcher: Batcher
    recorder: Recorder
    timeout_s: float
    debug_errors: bool
    sse_done: bool
    timing_suffix: str
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int | None
    _ids: itertools.count[int]
    _id_prefix: str

    async def _queued(
        self,
        receive: Any,
        send: Any,
        item_value: Any,
        accept: str,
        t0: int,
        durations: dict[str, int],
        *,
        unvalidated: bool = False,
        trailers: bool = False,
    ) -> None:
        """The usual path: through the batch worker, with the deadline and disconnect watch."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Item] = loop.create_future()
        item = Item(item_value, future=future, accept=accept, unvalidated=unvalidated)
        if unvalidated:
            item.durations["validate"] = durations.pop("validate", 0)
        if not self.batcher.submit(item):
            await self._reply(send, 503, error_body("server busy: the queue is full, retry later"), t0, durations, retry=True)
            return
        watcher = None
        try:
            if self.batcher.busy or self.batcher.depth() > 1:  # it will wait: free its slot if the client leaves
                watcher = asyncio.ensure_future(disconnected(receive))
                done, _ = await asyncio.wait({future, watcher}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
                if future not in done:
                    item.cancelled = True
                    if watcher in done:  # the client is gone: nobody to answer, but it is counted
                        self.recorder.record_ns({**durations, **item.durations}, time.perf_counter_ns() - t0, CLIENT_LEFT)
                        return
                    raise asyncio.TimeoutError
            else:
                # one timer instead of wait_for's wrapper future: this is every request's path
                timer = loop.call_later(self.timeout_s, expire, future)
                try:
                    await future
                finally:
                    timer.cancel()
        except asyncio.TimeoutError:
            item.cancelled = True
            await self._reply(send, 504, error_body(f"no answer within {self.timeout_s:g} s"), t0, durations)
            return
        finally:
            if watcher is not None:
                watcher.cancel()
        await self._answer(send, item, t0, durations, accept, receive, trailers)

    async def _answer(
        self, send: Any, item: Item, t0: int, durations: dict[str, int], accept: str, receive: Any, trailers: bool = False
    ) -> None:
        if item.channel is not None:  # the model yielded: its chunks are on their way
            await self._stream(send, receive, item, t0, durations, trailers)
            return
        durations.update(item.durations)
        if item.error is not None and item.status == 422:  # validate() refused it, or preprocess missed a field
            rid = self._request_id()
            exc = item.exc
            log.warning("servescope: request %s: invalid payload: %s: %s", rid, type(exc).__name__, exc)
            await self._reply(send, 422, self._error(invalid_payload(exc, self.debug_errors), rid), t0, durations, request_id=rid)  # type: ignore[arg-type]
            return
        if item.error is not None:
            rid = self._request_id()
            stage = item.stage or "model"
            log.error("servescope: request %s failed in %s: %s", rid, stage, item.error, exc_info=item.exc)
            message = f"internal error in the model's {stage}" + (f": {item.error}" if self.debug_errors else "")
            await self._reply(send, item.status, self._error(message, rid), t0, durations, request_id=rid)
            return
        ctype = b"application/msgpack" if accept == "msgpack" else b"application/json"
        await self._reply(send, 200, item.body or b"null", t0, durations, content_type=ctype)

    async def _stream(self, send: Any, receive: Any, item: Item, t0: int, durations: dict[str, int], trailers: bool) -> None:
        """Send a streamed answer chunk by chunk as the worker makes them; a failure after the
        first chunk ends the stream with an error line (SSE: an ``error`` event), since the
        status has gone out. Time to the first chunk and between chunks go to the recorder."""
        now = time.perf_counter_ns
        sse = item.accept == "sse"
        head = {**durations, **(item.head_timing or {})}
        timing = format_ns(head, max((item.first_ns or now()) - t0, 0)) + self.timing_suffix
        headers = [
            (b"content-type", b"text/event-stream" if sse else b"application/x-ndjson"),
            (b"cache-control", b"no-cache"),
            (b"server-timing", timing.encode()),
        ]
        if trailers:
            headers.append((b"trailer", b"server-timing"))
        await send({"type": "http.response.start", "status": 200, "headers": headers, "trailers": trailers})
        channel = item.channel

        def left(task: asyncio.Future[None]) -> None:
            if not task.cancelled():  # the client closed the connection: stop the model's work
                item.cancelled = True
                channel.put_nowait(None)

        watcher = asyncio.ensure_future(disconnected(receive))
        watcher.add_done_callback(left)
        first = last = 0
        gaps: list[int] = []
        try:
            while True:
                chunk = await channel.get()
                if chunk is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                item.sent += len(chunk)  # (the worker makes the next chunks while the reader keeps up)
                t = now()
                if first:
                    gaps.append(t - last)
                else:
                    first = t - t0
                last = t
        finally:
            watcher.cancel()
            if not item.ended:  # the client left, or this handler was cancelled (shutdown): stop the model's work
                item.cancelled = True
        if item.cancelled and not item.ended:  # the client left: nobody to finish for, but it is counted
            self.recorder.record_ns({**durations, **item.durations}, now() - t0, CLIENT_LEFT)
            return
        error = None
        if item.error is not None:
            rid = self._request_id()
            stage = item.stage or "model"
            log.error("servescope: request %s failed in %s, mid-stream: %s", rid, stage, item.error, exc_info=item.exc)
            message = self._error(f"internal error in the model's {stage}" + (f": {item.error}" if self.debug_errors else ""), rid)
            await send({"type": "http.response.body", "body": b"event: error\ndata: " + message + b"\n\n" if sse else message + b"\n", "more_body": True})
            error = "stream failed"
        total = now() - t0
        final = {**durations, **item.durations}
        end = b"data: [DONE]\n\n" if sse and self.sse_done and error is None else b""
        await send({"type": "http.response.body", "body": end, "more_body": False})
        if trailers:
            value = (format_ns(final, total) + self.timing_suffix).encode()
            await send({"type": "http.response.trailers", "headers": [(b"server-timing", value)], "more_trailers": False})
        self.recorder.record_ns(final, total, error)
        if first:
            self.recorder.record_stream(first, gaps)

    def _on_stream(self, items: list[Item]) -> None:
        """From the worker thread: hand streamed chunks (and ends) to the event loop, in one wake-up."""
        batch = []
        for it in items:
            chunks, it.chunks = it.chunks, []
            if it.future is not None:
                batch.append((it, chunks or [], it.ended))
            else:  # warm-up's items have no one to send to: nothing waits for a reader
                it.sent = it.handed
        if batch and threading.get_ident() == self._loop_thread:  # a stream started inline, on the loop
            push(batch)
        elif batch and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(push, batch)
            except RuntimeError:  # the loop is closed
                pass

    def _request_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):x}"

    @staticmethod
    def _error(message: str, request_id: str) -> bytes:
        return orjson.dumps({"error": message, "request_id": request_id})

    def _deliver(self, items: list[Item]) -> None:
        """From the worker thread: hand a finished batch back to the event loop, in one wake-up."""
        futures = [(it.future, it) for it in items if it.future is not None]
        if futures and threading.get_ident() == self._loop_thread:  # run inline, on the loop: no hand-off
            resolve(futures)
        elif futures and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(resolve, futures)
            except RuntimeError:  # the loop is closed: a worker abandoned as stuck woke after the server stopped
                pass

    async def _reply(
        self,
        send: Any,
        status: int,
        body: bytes,
        t0: int,
        durations: dict[str, int],
        *,
        retry: bool = False,
        content_type: bytes = b"application/json",
        request_id: str | None = None,
        close: bool = False,
    ) -> None:
        total = time.perf_counter_ns() - t0
        timing = format_ns(durations, total) + self.timing_suffix
        headers = [(b"content-type", content_type), (b"server-timing", timing.encode())]
        if retry:
            headers.append((b"retry-after", b"1"))
        if request_id is not None:
            headers.append((b"x-request-id", request_id.encode()))
        if close:
            headers.append((b"connection", b"close"))
        await respond(send, status, body, headers)
        error = None if status < 400 else f"HTTP {status}"
        self.recorder.record_ns(durations, total, error)  # /metrics is computed from it
