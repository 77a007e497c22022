"""Instrument an existing service in one line: ASGI (FastAPI, Starlette) and WSGI (Flask).

    app.add_middleware(servescope.middleware.ServescopeMiddleware)          # FastAPI / Starlette
    app.wsgi_app = servescope.middleware.ServescopeWSGIMiddleware(app.wsgi_app)  # Flask

Each sampled request gets a trace: ``receive`` (reading the body) and ``send`` (writing the
response) are timed here, handlers add their own stages with ``servescope.stage()``, the
response carries a ``Server-Timing`` header with the stages measured before it was sent, and
the finished trace goes to the recorder and to each exporter (Prometheus, OpenTelemetry,
JSON lines: see exporters.py).

``/metrics`` (``metrics_path``; None turns it off) is served where the app has no route of its
own there: by a ``PrometheusExporter`` among the exporters, else computed from the recorder
when scraped (nothing per request). Prometheus's text format is prometheus-client's to write:
without it installed, ``/metrics`` answers 501 with the command that installs it.

The middleware only adds: an app that sends its own ``Server-Timing`` keeps it as it is
(the recorder adopts its stages), and the added line carries only the names the app's did not.
Nothing the app sends (a malformed or absurd header, any iterable of headers) can break its
response.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import random
import time
from typing import Any, Awaitable, Callable, Iterable, Iterator, Sequence

from .exceptions import ConfigError, MissingDependencyError
from .recorder import Recorder
from .servertiming import TOTAL, format_ns, server_timing_durations
from .timing import Trace, stage

__all__ = ["RequestInfo", "ServescopeMiddleware", "ServescopeWSGIMiddleware"]

log = logging.getLogger("servescope")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: ``/metrics`` without prometheus-client (the same answer as ``servescope serve``'s)
_NO_PROMETHEUS = b"metrics need prometheus-client: pip install 'servescope[prometheus]'\n"


class RequestInfo:
    """What exporters learn about a request besides its trace."""

    __slots__ = ("method", "path", "status")

    def __init__(self, method: str, path: str, status: int | None = None) -> None:
        self.method = method
        self.path = path
        self.status = status

    def __repr__(self) -> str:
        return f"RequestInfo({self.method} {self.path} -> {self.status})"


class _Instrumentation:
    """What both middlewares share: sampling, the recorder, exporters, /metrics."""

    def __init__(
        self,
        app: Any,
        *,
        recorder: Recorder | None = None,
        exporters: Sequence[Any] = (),
        sample_rate: float = 1.0,
        server_timing: bool = True,
        metrics_path: str | None = "/metrics",
        exclude_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        if not isinstance(sample_rate, (int, float)) or not 0.0 <= sample_rate <= 1.0:
            raise ConfigError(f"sample_rate must be a number between 0 and 1, got {sample_rate!r}")
        self.recorder = recorder if recorder is not None else Recorder()
        self.exporters = list(exporters)
        self.sample_rate = float(sample_rate)
        self.server_timing = server_timing
        self.metrics_path = metrics_path
        self.metrics = next((e for e in self.exporters if hasattr(e, "exposition")), None)
        if self.metrics is None and metrics_path is not None:
            from .exporters import RecorderMetrics

            try:  # computed from the recorder at scrape time: nothing more per request
                self.metrics = RecorderMetrics(self.recorder)
            except MissingDependencyError:
                self.metrics = None  # /metrics answers 501, naming the extra
        self.exclude = frozenset(exclude_paths) | ({metrics_path} if metrics_path else set())
        self._failed_exporters: set[int] = set()
        self._timing_failed = False

    def sampled(self, path: str) -> bool:
        if path in self.exclude:
            return False
        return self.sample_rate >= 1.0 or random.random() < self.sample_rate

    def metrics_response(self) -> tuple[int, bytes, str]:
        """Status, body and content type for ``metrics_path``."""
        if self.metrics is None:
            return 501, _NO_PROMETHEUS, "text/plain; charset=utf-8"
        body, content_type = self.metrics.exposition()
        return 200, body, content_type

    def header(self, tr: Trace, skip: set[str] | None = None) -> str:
        """Our Server-Timing value, without the names in ``skip`` (the app's own)."""
        durations, total = tr.elapsed_ns()
        if skip:
            durations = {k: v for k, v in durations.items() if k not in skip}
            if TOTAL in skip:
                total = None
        return format_ns(durations, total)

    @staticmethod
    def adopt(tr: Trace, own: str) -> set[str]:
        """Add the stages an app reported in its own Server-Timing value to the trace; return
        the names it used (the middleware's line leaves them out)."""
        try:
            stages, total = server_timing_durations(own)
        except ValueError:
            return set()  # malformed, or absurd durations: passed on as is, not recorded
        for name, ms in stages.items():
            if name != "other":
                tr.add(name, ms)
        return {*stages, TOTAL} if total is not None else set(stages)

    def timing_line(self, tr: Trace, headers: list[Any], key: Any) -> Any:
        """Adopt the app's own Server-Timing lines (``key`` names them) into the trace; return
        our line (bytes or str, as ``key``), or None. Never raises: the response is the app's."""
        try:
            own = [v for k, v in headers if k.lower() == key]
            skip = None
            if own:
                joined = b", ".join(own).decode("latin-1") if isinstance(key, bytes) else ", ".join(own)
                skip = self.adopt(tr, joined)
            if not self.server_timing:
                return None
            value = self.header(tr, skip)
            if not value:
                return None
            return value.encode("latin-1") if isinstance(key, bytes) else value
        except Exception:
            if not self._timing_failed:
                self._timing_failed = True
                log.exception("servescope: adding Server-Timing failed; responses go out without it")
            return None

    def _close(self, tr: Trace, info: RequestInfo, exc: BaseException | None) -> None:
        """Stop the clock if the response did not, mark failures, record, export."""
        tr.stop()
        if exc is not None:
            tr.fail(exc)
        elif info.status is not None and info.status >= 400:
            tr.fail(f"HTTP {info.status}")
        self.recorder.record(tr)
        self.export(tr, info)

    def export(self, tr: Trace, info: RequestInfo) -> None:
        for exporter in self.exporters:
            try:
                exporter.export(tr, info)
            except Exception:  # an exporter must never break the user's request
                if id(exporter) not in self._failed_exporters:
                    self._failed_exporters.add(id(exporter))
                    log.exception("servescope: exporter %r failed; its later failures are not logged", exporter)


class ServescopeMiddleware(_Instrumentation):
    """ASGI middleware: a trace per HTTP request.

        app = FastAPI()
        app.add_middleware(ServescopeMiddleware)   # Server-Timing on each response, and /metrics

    Keyword arguments: ``recorder`` (a ``Recorder``; one is made if omitted, see
    ``.recorder.report()``), ``exporters``, ``sample_rate`` (0..1, the share of requests traced;
    the others pay one random draw), ``server_timing`` (send the header), ``metrics_path``
    (where Prometheus metrics are served, ``"/metrics"``; None: nowhere), ``exclude_paths``
    (never traced).
    A response with status >= 400, or an app that raises, is recorded as a failed request.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.metrics_path is not None and path == self.metrics_path:
            await self._metrics_unless_routed(scope, receive, send)
            return
        if not self.sampled(path):
            await self.app(scope, receive, send)
            return

        tr = Trace(cuda="auto", recorder=None)
        info = RequestInfo(scope.get("method", "GET"), path)
        state = {"done": False, "body_read": False}

        async def timed_receive() -> Message:
            if state["body_read"]:  # later calls wait for a disconnect: not the request's work
                return await receive()
            with stage("receive"):
                message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body_read"] = True
            return message

        async def timed_send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                info.status = message["status"]
                message = self._with_timing(tr, message)
            with stage("send"):
                await send(message)
            if kind == "http.response.body" and not message.get("more_body", False):
                tr.stop()  # the response is out: background tasks are not the request

        tr.start()
        try:
            await self.app(scope, timed_receive, timed_send)
        except BaseException as exc:
            tr.detach()
            self._close(tr, info, exc)  # recorded with the exception, even after a 500 was sent
            raise
        tr.detach()
        self._close(tr, info, None)

    def _with_timing(self, tr: Trace, message: Message) -> Message:
        """The response start with our Server-Timing line added after the app's own."""
        # any iterable of pairs is valid ASGI: read it once, into the list that is sent
        headers = list(message.get("headers") or ())
        line = self.timing_line(tr, headers, b"server-timing")
        if line is not None:
            headers.append((b"server-timing", line))
        return {**message, "headers": headers}

    async def _metrics_unless_routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's own route at the metrics path wins; where it answers 404, ours serves."""
        state = {"missing": False}

        async def send_unless_missing(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 404:
                state["missing"] = True
            if not state["missing"]:
                await send(message)

        await self.app(scope, receive, send_unless_missing)
        if state["missing"]:
            await self._serve_metrics(send)

    async def _serve_metrics(self, send: Send) -> None:
        status, body, content_type = self.metrics_response()
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class ServescopeWSGIMiddleware(_Instrumentation):
    """WSGI middleware (Flask, Django, any WSGI app): a trace per request.

        app.wsgi_app = ServescopeWSGIMiddleware(app.wsgi_app)

    The same keyword arguments as the ASGI middleware. ``receive`` times reads of
    ``wsgi.input``; ``send`` times the server writing each chunk of the response.
    """

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if self.metrics_path is not None and path == self.metrics_path:
            return self._metrics_unless_routed(environ, start_response)
        if not self.sampled(path):
            return self.app(environ, start_response)

        tr = Trace(cuda="auto")
        info = RequestInfo(environ.get("REQUEST_METHOD", "GET"), path)
        if "wsgi.input" in environ:
            environ["wsgi.input"] = _TimedInput(environ["wsgi.input"])

        def timed_start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            try:
                info.status = int(status.split(" ", 1)[0])
            except ValueError:
                info.status = None
            headers = list(headers)  # PEP 3333 asks for a list; any iterable is read once
            line = self.timing_line(tr, headers, "server-timing")
            if line is not None:
                headers.append(("Server-Timing", line))
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        tr.start()
        try:
            result = self.app(environ, timed_start_response)
        except BaseException as exc:
            tr.detach()
            self._close(tr, info, exc)
            raise
        # the body is written after we return, outside this context: a streamed body's
        # generator runs in a copy of it (its stages land in this request), the server's
        # writes are timed by hand
        ctx = contextvars.copy_context()
        tr.detach()
        return _TimedBody(result, tr, info, self, ctx)

    def _metrics_unless_routed(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """The app's own route at the metrics path wins; where it answers 404, ours serves."""
        state = {"missing": False, "started": False}

        def start_unless_missing(status: str, headers: Any, exc_info: Any = None) -> Any:
            state["started"] = True
            if status.startswith("404"):
                state["missing"] = True
                return lambda data: None
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        result = self.app(environ, start_unless_missing)
        first: list[bytes] = []
        chunks = None
        if not state["started"]:  # an app may start the response with its first chunk
            chunks = iter(result)
            first = list(itertools.islice(chunks, 1))
        if state["missing"]:
            close = getattr(result, "close", None)
            if close is not None:
                close()
            status, body, content_type = self.metrics_response()
            line = "200 OK" if status == 200 else "501 Not Implemented"
            start_response(line, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
            return [body]
        return result if chunks is None else _Prepended(first, chunks, result)


class _Prepended:
    """A response iterable whose first chunk was already read, closed like the original."""

    def __init__(self, first: list[bytes], rest: Iterator[bytes], result: Iterable[bytes]) -> None:
        self._first, self._rest, self._result = first, rest, result

    def __iter__(self) -> Iterator[bytes]:
        yield from self._first
        yield from self._rest

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if close is not None:
            close()


_DONE: Any = object()


class _TimedInput:
    """``wsgi.input`` whose reads are the ``receive`` stage."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def read(self, *args: Any) -> bytes:
        with stage("receive"):
            return self._stream.read(*args)

    def readline(self, *args: Any) -> bytes:
        with stage("receive"):
            return self._stream.readline(*args)

    def readinto(self, buffer: Any) -> int | None:
        with stage("receive"):
            return self._stream.readinto(buffer)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _TimedBody:
    """The response iterable: each chunk is made in the request's context (a streaming
    generator's stages count), and the time the server takes to write it is ``send``."""

    def __init__(
        self, result: Iterable[bytes], tr: Trace, info: RequestInfo, mw: ServescopeWSGIMiddleware, ctx: contextvars.Context
    ) -> None:
        self._result = result
        self._tr = tr
        self._info = info
        self._mw = mw
        self._ctx = ctx
        self._send_ns = 0
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._result)
        run = self._ctx.run
        now = time.perf_counter_ns
        while True:
            try:
                chunk = run(next, chunks, _DONE)
            except BaseException as exc:  # the stream broke off: a failed request
                self.close(exc)
                raise
            if chunk is _DONE:
                break
            t0 = now()
            yield chunk  # the server writes it
            self._send_ns += now() - t0
        # the body is out: end the request here too, since some servers (uvicorn's WSGI
        # adapter) never call close() as PEP 3333 asks
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            self._tr.add("send", self._send_ns / 1e6)
            self._mw._close(self._tr, self._info, error)
