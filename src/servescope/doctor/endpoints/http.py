"""Apps served inside the doctor's process on a loopback port and driven with real HTTP:
uvicorn for ASGI (FastAPI, Starlette), a threading WSGI server for WSGI (Flask).

Real HTTP parsing, validation and serialization run, and the probes see inside the
handler: each request gets a trace (from servescope's middleware) and an evidence record.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from ...exceptions import EndpointError
from ...middleware import ServescopeMiddleware, ServescopeWSGIMiddleware
from ...timing import Trace
from ..context import end_evidence
from ..probes import current_evidence, new_evidence, set_evidence, reset_evidence
from .base import Observation
from .client import Sent, send_in_turn
from .loop_watch import LoopWatch
from .main_thread import MainJob, on_main_thread
from .outside import OutsideLoad, Row, closed_loop_block, rows_of
from .wsgi_server import LeaderWSGIServer

__all__ = ["ASGIEndpoint", "REQUEST_ID_HEADER", "WSGIEndpoint", "free_port"]

#: The header each sequential request carries, so its server-side trace is found by id.
REQUEST_ID_HEADER = "X-Servescope-Doctor-Request"
_REQUEST_ID_BYTES = REQUEST_ID_HEADER.lower().encode()
#: Every answer names its request's id in a Server-Timing entry (as a replica on Ray names
#: itself): the load generator of the concurrent phase sends the same bytes each time, and
#: keeps each answer's Server-Timing, so that is how its results find their traces.
REQUEST_ID_ENTRY = "servescope-doctor-request"
_server_ids = itertools.count(1)


def _request_id(sent: str | None) -> str:
    """The id the client sent, or one the server gives a request that came without."""
    return sent or f"s{next(_server_ids)}"


def _timing_entry(rid: str) -> bytes:
    return f'{REQUEST_ID_ENTRY};desc="{rid}"'.encode("latin-1")


class _Collector:
    """An exporter that keeps each finished server-side trace with its evidence."""

    def __init__(self) -> None:
        self.by_id: dict[str, tuple[Trace, dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def export(self, trace: Trace, info: Any) -> None:
        ev = current_evidence()
        if ev is not None and ev.get("request_id"):
            with self.lock:
                self.by_id[ev["request_id"]] = (trace, ev)

    def find(self, rid: str) -> tuple[Trace, dict[str, Any]] | None:
        with self.lock:
            return self.by_id.pop(rid, None)

    def forget(self) -> None:
        """Drop the traces no client result claimed (requests abandoned, or still running)."""
        with self.lock:
            self.by_id.clear()


class _HTTPEndpoint:
    """What the ASGI and WSGI targets share: the client side."""

    kind = "http"
    path = "/predict"

    def __init__(self, path: str) -> None:
        self.path = path
        self.method, self.content_type = "POST", "application/json"  # (make_endpoint sets what the doctor sends)
        self.collector = _Collector()
        self.host = "127.0.0.1"
        self.port = 0
        self.loop_watch = LoopWatch()  # (an ASGI app's loop; a WSGI app has none to watch)
        self._next_id = 0
        self._outside: OutsideLoad | None = None
        self.load_from = ""  # where the last concurrent phase's load came from (said in the evidence)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    @property
    def loop_thread_id(self) -> int | None:
        return None

    def request(self, body: bytes, timeout_s: float, path: str | None = None) -> Observation:
        return self.one_by_one(body, 1, timeout_s, timeout_s, path)[0]

    def one_by_one(self, body: bytes, n: int, timeout_s: float, max_seconds: float, path: str | None = None) -> list[Observation]:
        """Up to ``n`` requests, one after another (none starts after ``max_seconds``, or after
        one that timed out); each server-side trace is found by the id its request carries in a
        header (a request abandoned earlier may finish later: its trace must not be taken for
        one of these)."""
        self._in_turn(True)
        rids, headers = [], []
        for _ in range(n):
            self._next_id += 1
            rids.append(str(self._next_id))
            headers.append({REQUEST_ID_HEADER: rids[-1]} | ({"Content-Type": self.content_type} if self.content_type and body else {}))
        out = []
        for rid, sent in zip(rids, self._send(path or self.path, body, headers, timeout_s, max_seconds)):
            wait_until = time.monotonic() + 1.0  # the server records just after the last byte
            found = self.collector.find(rid)
            while found is None and time.monotonic() < wait_until and sent.error is None:
                time.sleep(0.0005)
                found = self.collector.find(rid)
            tr, ev = found or (None, None)
            out.append(Observation(sent.latency_ms, sent.status, sent.error, tr, ev or {}, sent.data, sent.first_chunk_ms, sent.gaps_ms))
        return out

    def _in_turn(self, one_at_a_time: bool) -> None:
        """Whether the requests to come are sent one at a time (the WSGI server's main thread
        then serves each, as a sync worker does)."""

    def _send(self, path: str, body: bytes, headers: list[dict[str, str]], timeout_s: float, max_seconds: float) -> list[Sent]:
        """From the helper process once ``ready_load`` started it, as a server's clients send,
        all in one go: a client in the app's own process, or one this process wakes for each
        request, moves where the kernel runs the app's threads (an ONNX Runtime session built
        per request, whose threads it pins to cores, ran 2-4 ms slower on the core it pins,
        where this process's client put it over half the time, and gunicorn's requests under
        a tenth). From this process where no helper runs (a fresh child's first requests, or
        a helper that broke)."""
        if self._outside is not None and self._outside.proc is not None:
            got = self._outside.one_by_one(self.host, self.port, self.method, path, body, headers, timeout_s, max_seconds)
            if got is not None:
                return got
        return send_in_turn(self.host, self.port, self.method, path, body, headers, timeout_s, max_seconds)

    def concurrent(
        self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Observation], float]:
        """The concurrent phase: its load comes from a helper process as a server's clients'
        does (endpoints/outside.py), from this process where no helper could run; each result
        finds its trace by the id its answer named (one that got no answer has none, and never
        takes another's)."""
        t0 = time.perf_counter()
        self._in_turn(concurrency <= 1)
        got = self._outside_rows(body, concurrency, requests, timeout_s, max_seconds)
        self.load_from = "a helper process"
        if got is None:  # (what the helper spent before it broke is not spent again)
            assert self._outside is not None
            self.load_from = f"this process: no helper process could send it ({self._outside.broken})"
            left = max(max_seconds - (time.perf_counter() - t0), 1.0)
            results, elapsed = closed_loop_block(
                self.url, self.method, body, self.content_type, concurrency=concurrency, requests=requests, timeout_s=timeout_s, max_seconds=left
            )
            got = rows_of(results), elapsed
        rows, elapsed = got
        obs = []
        wait_until = time.monotonic() + 1.0  # (the server records just after the last byte)
        for r in rows:
            found = self.collector.find(r.request_id) if r.request_id else None
            while found is None and r.request_id and r.error is None and time.monotonic() < wait_until:
                time.sleep(0.0005)
                found = self.collector.find(r.request_id)
            tr, ev = found or (None, None)
            obs.append(Observation(r.latency_ms, r.status, r.error, tr, ev or {}, None, r.first_chunk_ms, r.chunk_gaps_ms))
        self.collector.forget()
        return obs, elapsed

    def concurrent_from_outside(
        self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Observation], float] | None:
        """The load of ``concurrent`` from the helper process only (the experiments' blocks):
        latencies and errors, no traces. None when no helper could run it."""
        self._in_turn(concurrency <= 1)
        got = self._outside_rows(body, concurrency, requests, timeout_s, max_seconds)
        self.collector.forget()  # (the server kept a trace of each: none is claimed)
        if got is None:
            return None
        rows, elapsed = got
        return [Observation(r.latency_ms, r.status, r.error, first_chunk_ms=r.first_chunk_ms) for r in rows], elapsed

    def ready_load(self) -> None:
        """Start the load's helper process before a phase's clock starts (its imports are not
        load); from then on the sequential requests are sent from it too (``_send``)."""
        if self._outside is None:
            self._outside = OutsideLoad()
        self._outside.start()

    def _outside_rows(self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float) -> tuple[list[Row], float] | None:
        self.ready_load()
        assert self._outside is not None
        return self._outside.run(
            self.url, self.method, body, self.content_type, concurrency=concurrency, requests=requests, timeout_s=timeout_s, max_seconds=max_seconds
        )

    def _close_outside(self) -> None:
        if self._outside is not None:
            self._outside.close()


class _EvidenceASGI:
    """Sets a fresh evidence record for each request; starts the loop watch once."""

    def __init__(self, app: Any, watch: LoopWatch) -> None:
        self.app = app
        self.watch = watch
        self._monitor: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._monitor is None:
                self._monitor = asyncio.ensure_future(self.watch.run())
            ev = new_evidence()
            sent = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == _REQUEST_ID_BYTES), None)
            ev["request_id"] = rid = _request_id(sent)
            entry = _timing_entry(rid)

            async def send_with_id(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), (b"server-timing", entry)]}
                await send(message)

            token = set_evidence(ev)
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                reset_evidence(token)
                end_evidence(ev)  # (a streamed answer is sent by now: the app has returned)
        else:
            await self.app(scope, receive, send)


class ASGIEndpoint(_HTTPEndpoint):
    kind = "asgi"

    def __init__(self, app: Any, path: str) -> None:
        super().__init__(path)
        self.user_app = app
        inner = ServescopeMiddleware(app, exporters=[self.collector], server_timing=True, metrics_path=None)
        self.app = _EvidenceASGI(inner, self.loop_watch)
        self._server: Any = None
        self._thread: threading.Thread | MainJob | None = None

    @property
    def loop_thread_id(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    def routes(self) -> list[tuple[str, list[str]]]:
        from ...serve import Routes, ServeApp

        own = [(p, ["GET"]) for p in ("/health", "/ready", "/metrics", "/report")]
        if isinstance(self.user_app, ServeApp):
            app = self.user_app
            return [(app.path, list(app.methods)), *own]
        if isinstance(self.user_app, Routes):
            return [*((p, list(a.methods)) for p, a in self.user_app.apps.items()), *own]
        out = []
        for r in getattr(self.user_app, "routes", None) or []:
            path = getattr(r, "path", None)
            if isinstance(path, str):
                out.append((path, sorted(getattr(r, "methods", None) or [])))
        return out

    def start(self, timeout_s: float) -> None:
        import uvicorn

        self.port = free_port()
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="error", access_log=False, lifespan="auto")
        self._server = uvicorn.Server(config)
        # its loop on the main thread where the child lends it, as uvicorn's own (main_thread.py)
        self._thread = on_main_thread(self._server.run)
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.run, daemon=True, name="servescope-uvicorn")
            self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise EndpointError("the app did not start: its start-up (lifespan) failed; run it alone to see why")
            if time.monotonic() > deadline:
                raise EndpointError(f"the app did not start within {timeout_s:g} s (--timeout)")
            time.sleep(0.01)
        while time.monotonic() < deadline and self._get("/ready") == 503:  # it loads in the background
            time.sleep(0.05)

    def _get(self, path: str) -> int | None:
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            return status
        except OSError:
            return None

    def stop(self) -> None:
        self._close_outside()
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True  # a handler that never returns is not waited for
        if self._thread is not None:
            self._thread.join(2)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # the doctor reports; no access log
        pass


class WSGIEndpoint(_HTTPEndpoint):
    kind = "wsgi"

    def __init__(self, app: Any, path: str) -> None:
        super().__init__(path)
        self.user_app = app
        inner = ServescopeWSGIMiddleware(app, exporters=[self.collector], server_timing=True, metrics_path=None)

        def with_evidence(environ: dict[str, Any], start_response: Any) -> Any:
            ev = new_evidence()  # each request has its own context
            ev["request_id"] = rid = _request_id(environ.get("HTTP_" + REQUEST_ID_HEADER.upper().replace("-", "_")))
            entry = _timing_entry(rid).decode("latin-1")

            def start_with_id(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                return start_response(status, [*headers, ("Server-Timing", entry)], exc_info)

            set_evidence(ev)
            return inner(environ, start_with_id)

        self.app = with_evidence
        self._server: Any = None

    def routes(self) -> list[tuple[str, list[str]]]:
        url_map = getattr(self.user_app, "url_map", None)
        if url_map is None:
            return []
        return [(r.rule, sorted(m for m in (r.methods or ()) if m not in ("HEAD", "OPTIONS"))) for r in url_map.iter_rules()]

    def start(self, timeout_s: float) -> None:
        self._server = LeaderWSGIServer((self.host, 0), _QuietHandler)
        self._server.set_app(self.app)
        self.port = self._server.server_address[1]
        self._server.start()

    def _in_turn(self, one_at_a_time: bool) -> None:
        if self._server is not None:
            self._server.one_at_a_time = one_at_a_time

    def stop(self) -> None:
        self._close_outside()
        if self._server is not None:
            self._server.stop()
            self._server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
