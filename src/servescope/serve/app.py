"""The HTTP side of the runtime: a plain ASGI app (no framework in the hot path).

    POST /predict   JSON in, JSON out (msgpack with ``Accept: application/msgpack``); the
                    route and its methods are ``path=``/``methods=`` (where clients already call)
    GET  /health    200 as soon as the process answers
    GET  /ready     200 once the model is loaded and warmed up, 503 before
    GET  /metrics   Prometheus histograms per stage, batch sizes, queue depth, requests by status
    GET  /report    the servescope Report of everything served so far (JSON, with distributions)
    POST /v1/completions, /v1/chat/completions, GET /v1/models: with ``openai="name"``, an
                    OpenAI-compatible front for the model (serve/openai.py)

Every /predict response carries ``Server-Timing`` with its stages. A model that yields
(``infer`` step by step, or ``postprocess`` chunk by chunk) streams its answer: JSON lines, or
Server-Sent Events with ``Accept: text/event-stream`` (ended by ``data: [DONE]`` with
``sse_done=True``, as OpenAI-style clients expect); the head's ``Server-Timing`` has the
stages before the first chunk, and a client that sends ``TE: trailers`` gets the complete
breakdown in a ``Server-Timing`` trailer (under ``servescope serve``, whose HTTP/1.1 protocol
sends trailers).

A prediction's answer (queued, streamed, replied) is answer.py's; loading, warm-up, the
watchdog and shutdown are lifecycle.py's: their methods are ``ServeApp``'s.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable

import orjson

from ..exceptions import ConfigError
from ..recorder import Recorder
from ..report import Report
from .answer import CLIENT_LEFT, Answering, invalid_payload  # noqa: F401 - re-exported
from .asgi import Metrics, error_body, read_too_slow, respond
from .batching import Batcher, Item
from .lifecycle import EXIT_STUCK, MAX_REPLACEMENTS, Lifecycle  # noqa: F401 - re-exported
from .limits import HttpLimits
from .model import Model
from .openai import OpenAIFront
from .runtime import Runtime

__all__ = ["ServeApp"]

log = logging.getLogger("servescope")


class ServeApp(Answering, Lifecycle):
    """The runtime as an ASGI app. Build it with ``servescope.serve(model, ...)``."""

    def __init__(
        self,
        model: Model,
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 0.0,
        max_batch_tokens: int | None = None,
        max_queue: int = 256,
        timeout_s: float = 30.0,
        max_body_bytes: int = 1 << 20,
        body_timeout_s: float = 30.0,
        max_header_bytes: int = 64 * 1024,
        header_timeout_s: float = 10.0,
        max_connections: int | None = None,
        example: Any = None,
        device: str | None = None,
        threads: int | None = None,
        lanes: int | None = None,
        warmup_batch_sizes: list[int] | None = None,
        recorder: Recorder | None = None,
        inline_below_ms: float = 0.0,
        batch_timeout_s: float | None = None,
        on_stuck: str = "replace",
        report_source: Callable[[], Report] | None = None,
        timing_suffix: str = "",
        report_interval_s: float = 1.0,
        debug_errors: bool = False,
        merged_metrics: bool = False,
        path: str = "/predict",
        methods: tuple[str, ...] = ("POST",),
        sse_done: bool = False,
        openai: str | None = None,
    ) -> None:
        if not isinstance(model, Model):
            raise ConfigError(
                f"serve() takes an instance of a servescope.Model subclass, got {model!r}"
                + (" (a class: add the brackets)" if isinstance(model, type) else "")
            )
        for name, value, low in (("max_batch_size", max_batch_size, 1), ("max_queue", max_queue, 1), ("max_body_bytes", max_body_bytes, 1)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {value!r}")
        if lanes is not None and (not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1):
            raise ConfigError(f"lanes must be a whole number >= 1 (forwards run at once; 1: one at a time), got {lanes!r}")
        if max_batch_tokens is not None and (not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
            raise ConfigError(f"max_batch_tokens must be a whole number >= 1 (items x the longest), got {max_batch_tokens!r}")
        if not isinstance(max_wait_ms, (int, float)) or max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        if not isinstance(inline_below_ms, (int, float)) or inline_below_ms < 0:
            raise ConfigError(f"inline_below_ms must be >= 0 (0: never inline), got {inline_below_ms!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        if batch_timeout_s is not None and (not isinstance(batch_timeout_s, (int, float)) or not 0 < batch_timeout_s < float("inf")):
            raise ConfigError(f"batch_timeout_s must be a number of seconds > 0, got {batch_timeout_s!r}")
        if not isinstance(body_timeout_s, (int, float)) or not 0 < body_timeout_s < float("inf"):
            raise ConfigError(f"body_timeout_s must be a number of seconds > 0, got {body_timeout_s!r}")
        if on_stuck not in ("replace", "exit"):
            raise ConfigError(f"on_stuck must be 'replace' or 'exit', got {on_stuck!r}")
        if not isinstance(report_interval_s, (int, float)) or not 0 <= report_interval_s < float("inf"):
            raise ConfigError(f"report_interval_s must be a number of seconds >= 0, got {report_interval_s!r}")
        if not isinstance(path, str) or not path.startswith("/") or path in ("/health", "/ready", "/metrics", "/report"):
            raise ConfigError(f"path must start with '/' and not be one of the runtime's own routes, got {path!r}")
        methods = tuple(m.upper() for m in ([methods] if isinstance(methods, str) else methods))
        if not methods or any(m not in ("POST", "PUT", "PATCH") for m in methods):
            raise ConfigError(f"methods must be among POST, PUT, PATCH (the request carries a JSON body), got {methods!r}")
        #: the route the model answers at, and its methods: where the endpoint's clients already call it
        self.path, self.methods = path, methods
        #: end a Server-Sent Events stream with ``data: [DONE]``, as OpenAI-style clients wait for
        self.sse_done = bool(sse_done)
        if openai is not None and (not isinstance(openai, str) or not openai.strip()):
            raise ConfigError(f"openai must be the model's name, as clients will send it in \"model\", got {openai!r}")
        if openai is not None and path.startswith("/v1/"):
            raise ConfigError(f"path {path!r} is under /v1/, which the OpenAI-compatible front answers: give the model another path")
        #: with ``openai="name"``: /v1/completions, /v1/chat/completions and /v1/models (serve/openai.py)
        self.openai = OpenAIFront(self, openai.strip()) if openai is not None else None
        self.model = model
        self.example = example if example is not None else model.example
        self.timeout_s = float(timeout_s)
        # a batch running longer than this is stuck: the watchdog replaces its worker, or
        # (on_stuck="exit", as `servescope serve` runs) ends the process for its supervisor
        self.batch_timeout_s = float(batch_timeout_s if batch_timeout_s is not None else timeout_s)
        self.on_stuck = on_stuck
        self.stuck: str | None = None  # the last stuck batch, as /ready and the log say it
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = float(body_timeout_s)
        # the server's own limits (head size and time, connections): applied by run()
        self.limits = HttpLimits(
            max_header_bytes=max_header_bytes,
            header_timeout_s=header_timeout_s,
            **({"max_connections": max_connections} if max_connections is not None else {}),
        )
        self._too_big = error_body(f"request body over {max_body_bytes} bytes")
        self.runtime = Runtime(model, device=device, threads=threads, max_batch_tokens=max_batch_tokens, lanes=lanes)
        self.batcher = Batcher(self.runtime.process, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=max_queue)
        sizes = warmup_batch_sizes
        if sizes is None:  # powers of two up to the largest batch, and the largest itself
            sizes = sorted({min(2**k, max_batch_size) for k in range(max_batch_size.bit_length() + 1)})
        self.warmup_batch_sizes = sizes
        self.recorder = recorder if recorder is not None else Recorder()
        # where GET /report comes from (replicas on Ray and workers merge every one's figures
        # there), and what each Server-Timing value ends with (a replica names itself and the
        # proxy before it); with merged_metrics, /metrics is built from that merged report too
        self.report_source = report_source or (lambda: self.recorder.report(tool="servescope serve"))
        self.merged_metrics = bool(merged_metrics)
        self.metrics = Metrics.create(self.report_source if self.merged_metrics else self.recorder)
        self.timing_suffix = timing_suffix
        # GET /report is built (off the loop) at most once per interval; scrapes in between, and
        # those while one is being built, share that body: scraping it cannot starve /predict
        self.report_interval_s = float(report_interval_s)
        self._report: tuple[float, bytes] | None = None  # (built at, body)
        self._report_build: asyncio.Future[bytes] | None = None
        self._now = time.monotonic
        # a lone request on a fast model runs on the event loop (no thread hand-offs) when
        # nothing else is in flight; `_lone_ns` is a single item's measured time, from warm-up on
        self.inline_below_ns = round(inline_below_ms * 1e6)
        self._lone_ns: int | None = None
        self._active = 0  # predictions waiting on the worker
        self._open = 0  # a prediction deciding whether it is alone
        self.state = "starting"
        self.failure: str | None = None
        self.info: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._server: Any = None  # the uvicorn server run() started, if it did
        self._ready = threading.Event()
        self._msgpack = importlib.util.find_spec("msgpack") is not None  # else JSON for everyone
        # a failed request's details go to the log under a request id; the client gets the id
        # and what failed in general terms (the exception's text only with debug_errors)
        self.debug_errors = bool(debug_errors)
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}"

    async def _report_body(self) -> bytes:
        """The /report body: the one built within the interval, the one being built, or a new one."""
        cached = self._report
        if cached is not None and self._now() - cached[0] < self.report_interval_s:
            return cached[1]
        if self._report_build is None:
            self._report_build = asyncio.ensure_future(self._build_report())
        return await asyncio.shield(self._report_build)  # a scraper that leaves cancels only itself

    async def _build_report(self) -> bytes:
        try:
            body = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.report_source().to_json(indent=False, samples=False).encode()
            )  # the JSON too: a report of many samples is milliseconds of work, off the loop
            self._report = (self._now(), body)
            return body
        finally:
            self._report_build = None

    # -- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            method = scope["method"]
            if path == self.path:
                if method not in self.methods:
                    allow = ", ".join(self.methods)
                    await respond(send, 405, error_body(f"use {allow} {self.path} with a JSON body"), [(b"allow", allow.encode())])
                else:
                    await self._predict(scope, receive, send)
            elif self.openai is not None and path.startswith("/v1/"):
                await self.openai(scope, receive, send)
            elif path == "/health":
                await respond(send, 200, orjson.dumps({"status": "alive", "state": self.state}))
            elif path == "/ready":
                ok = self.state == "ready"
                body: dict[str, Any] = {"ready": ok, "state": self.state}
                if self.failure:
                    body["error"] = self.failure
                if self.stuck:  # the last stuck batch, also once a new worker took over
                    body["stuck"] = self.stuck
                    body["worker_replacements"] = self.batcher.replacements
                await respond(send, 200 if ok else 503, orjson.dumps(body))
            elif path == "/metrics":
                await self._serve_metrics(send)
            elif path == "/report":
                try:
                    body = await self._report_body()
                except Exception as exc:  # a Ray collector out of reach: say so, keep serving
                    await respond(send, 503, error_body(f"no report now: {type(exc).__name__}: {exc}"))
                else:
                    await respond(send, 200, body)
            else:
                routes = f"{'/'.join(self.methods)} {self.path}, GET /health, /ready, /metrics, /report"
                if self.openai is not None:
                    routes += ", POST /v1/completions, /v1/chat/completions, GET /v1/models"
                await respond(send, 404, error_body(f"no route {path}: {routes}"))
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        await self.startup()
                    except Exception as exc:  # pragma: no cover - startup only spawns a thread
                        await send({"type": "lifespan.startup.failed", "message": str(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _predict(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        now = time.perf_counter_ns
        t0 = now()
        if self.state != "ready":
            status = 500 if self.state == "failed" else 503
            why = f" ({self.failure})" if self.failure and self.debug_errors else (": start-up failed, see the server log" if self.failure else "")
            await self._reply(send, status, error_body(f"not ready: {self.state}{why}"), t0, {}, retry=status == 503)
            return
        # receive, with a size limit: a declared length over it is refused before reading a
        # byte, a body that grows past it as soon as it does; either way the connection is
        # closed after the 413, so the rest is never read
        accept = "json"
        trailers = False
        for name, value in scope.get("headers", ()):  # one pass over the headers
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                await self._reply(send, 413, self._too_big, t0, {}, close=True)
                return
            if name == b"accept":
                if b"msgpack" in value and self._msgpack:
                    accept = "msgpack"
                elif b"text/event-stream" in value:
                    accept = "sse"  # for a streamed answer (a plain one is JSON all the same)
            elif name == b"te" and b"trailers" in value.lower():
                trailers = "http.response.trailers" in scope.get("extensions", {})
        body = b""
        more = True
        # a body that does not arrive within body_timeout_s gets a 408: one timer that cancels
        # this task's wait for it, not a wrapper task per read (this is every request's path)
        task = asyncio.current_task()
        expired: list[bool] = []
        late = self._loop.call_later(self.body_timeout_s, read_too_slow, task, expired) if task and self._loop else None
        try:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_body_bytes:
                    await self._reply(send, 413, self._too_big, t0, {}, close=True)
                    return
        except asyncio.CancelledError:
            if not expired:  # the server's cancel (shutdown), not ours
                raise
            if hasattr(task, "uncancel"):  # Python >= 3.11: this cancel is handled here
                task.uncancel()  # type: ignore[union-attr]
            late = None
            msg = f"request body not received within {self.body_timeout_s:g} s"
            await self._reply(send, 408, error_body(msg), t0, {}, close=True)
            return
        finally:
            if late is not None:
                late.cancel()
        t1 = now()
        durations: dict[str, int] = {"receive": t1 - t0}
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            durations["validate"] = now() - t1
            await self._reply(send, 400, error_body(f"request body is not valid JSON: {exc}"), t0, durations)
            return
        if not self.inline_below_ns:  # the default: Model.validate runs on the worker, off the loop
            durations["validate"] = now() - t1  # (parsing; the worker adds validate's own time)
            self._active += 1
            try:
                await self._queued(receive, send, payload, accept, t0, durations, unvalidated=True, trailers=trailers)
            finally:
                self._active -= 1
            return
        try:
            item_value = self.model.validate(payload)
        except Exception as exc:
            durations["validate"] = now() - t1
            rid = self._request_id()
            log.warning("servescope: request %s: invalid payload: %s: %s", rid, type(exc).__name__, exc)
            await self._reply(send, 422, self._error(invalid_payload(exc, self.debug_errors), rid), t0, durations, request_id=rid)
            return
        durations["validate"] = now() - t1
        if self._alone():
            self._open += 1  # seen by requests read in the same loop iteration...
            try:
                await asyncio.sleep(0)  # ...which run up to here now: alone means alone
            finally:
                self._open -= 1
            item = Item(item_value, accept=accept, future=self._loop.create_future())  # type: ignore[union-attr]
            if self._alone() and self.batcher.run_inline(item):  # this thread is busy meanwhile
                took = sum(item.durations.values())
                self._lone_ns = (self._lone_ns * 7 + took) >> 3  # type: ignore[operator]  # turns slow: stops
                if item.streaming:  # the model yielded: the worker takes the stream's next steps
                    self.batcher.wake()
                    if item.channel is None:  # no chunk yet: wait for the first (or the answer's end)
                        try:
                            await asyncio.wait_for(asyncio.shield(item.future), self.timeout_s)  # type: ignore[arg-type]
                        except asyncio.TimeoutError:
                            item.cancelled = True
                            await self._reply(send, 504, error_body(f"no answer within {self.timeout_s:g} s"), t0, durations)
                            return
                await self._answer(send, item, t0, durations, accept, receive, trailers)
                return
        self._active += 1
        try:
            await self._queued(receive, send, item_value, accept, t0, durations, trailers=trailers)
        finally:
            self._active -= 1

    def _alone(self) -> bool:
        """No other prediction in flight, an idle worker, and a model fast enough that running
        it on the event loop blocks nothing that matters (``inline_below_ms``)."""
        lone = self._lone_ns
        return (
            lone is not None and lone < self.inline_below_ns and self._open == 0 and self._active == 0
            and self.batcher.idle()
        )  # fmt: skip

    async def _serve_metrics(self, send: Any) -> None:
        if self.metrics is None:
            await respond(send, 501, error_body("metrics need prometheus-client: pip install 'servescope[prometheus]'"))
            return
        self.metrics.queue_depth.set(self.batcher.depth())
        if self.merged_metrics:  # reading the other workers' figures: off the loop
            body, ctype = await asyncio.get_running_loop().run_in_executor(None, self.metrics.exposition)
        else:
            body, ctype = self.metrics.exposition()
        await respond(send, 200, body, [(b"content-type", ctype.encode())])
