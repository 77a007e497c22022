"""What the doctor examines: a plain function, an ASGI app, a WSGI app, or a running URL.

Apps are served inside the doctor's own process on a loopback port (uvicorn for ASGI, a
threading WSGI server for WSGI), so real HTTP parsing, validation and serialization run,
and the probes see inside the handler. Each request gets a trace and an evidence dict.
"""

from __future__ import annotations

import asyncio
import contextvars
import http.client
import inspect
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from socketserver import ThreadingMixIn

import orjson

from .exceptions import ConfigError
from .middleware import ServescopeMiddleware, ServescopeWSGIMiddleware
from .probes import new_evidence, set_evidence
from .timing import Trace

__all__ = ["Observation", "make_target"]


@dataclass
class Observation:
    """One request as the doctor saw it."""

    latency_ms: float
    status: int | None = None
    error: str | None = None
    trace: Trace | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


class _Collector:
    """An exporter that keeps each finished server-side trace with its evidence."""

    def __init__(self) -> None:
        self.items: list[tuple[Trace, dict[str, Any] | None]] = []
        self.lock = threading.Lock()

    def export(self, trace: Trace, info: Any) -> None:
        from .probes import current_evidence

        with self.lock:
            self.items.append((trace, current_evidence()))


class FunctionTarget:
    """A plain callable, called with the parsed payload in the doctor's process."""

    kind = "function"
    url = None

    def __init__(self, fn: Callable[..., Any], timeout_s: float) -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="servescope-call")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lag_ms: list[float] = []

    def start(self) -> None:
        if self.is_async:  # async handlers run on one event loop, as a server would
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="servescope-loop")
            self._thread.start()
            self._monitor = asyncio.run_coroutine_threadsafe(_lag_monitor(self.lag_ms), self._loop)

    def stop(self) -> None:
        loop = self._loop
        if loop is not None:

            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(5)
            except Exception:  # a handler that will not stop: leave it to the daemon thread
                pass
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(5)
            if not loop.is_running():
                loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, payload: Any) -> Observation:
        ev = new_evidence()
        t0 = time.perf_counter_ns()
        tr = Trace()
        if self.is_async:
            assert self._loop is not None

            async def run() -> Any:
                set_evidence(ev)
                with tr:
                    return await self.fn(payload)

            fut = asyncio.run_coroutine_threadsafe(run(), self._loop)
            try:
                fut.result(self.timeout_s)
                err = None
            except TimeoutError:
                fut.cancel()
                err = f"timeout: no answer within {self.timeout_s:g} s"
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
        else:

            def run_sync() -> Any:
                set_evidence(ev)
                with tr:
                    return self.fn(payload)

            ctx = contextvars.copy_context()
            fut2 = self._pool.submit(ctx.run, run_sync)
            try:
                fut2.result(self.timeout_s)
                err = None
            except TimeoutError:
                err = f"timeout: no answer within {self.timeout_s:g} s"
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
        latency = (time.perf_counter_ns() - t0) / 1e6
        return Observation(latency, None, err, tr if tr.total_ns is not None else None, ev)

    def request(self, payload: Any, body: bytes) -> Observation:
        return self._one(payload)

    def concurrent(
        self, payload: Any, body: bytes, concurrency: int, requests: int, max_seconds: float
    ) -> tuple[list[Observation], float]:
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        obs: list[Observation] = []
        lock = threading.Lock()
        budget = [requests]

        def caller() -> None:
            while time.perf_counter() < deadline:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                o = self._one(payload)
                with lock:
                    obs.append(o)

        threads = [threading.Thread(target=caller) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return obs, time.perf_counter() - t0


class _HTTPTarget:
    """Shared by the in-process ASGI and WSGI servers and a URL."""

    kind = "http"

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.collector = _Collector()
        self.host = "127.0.0.1"
        self.port = 0
        self.lag_ms: list[float] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def request(self, payload: Any, body: bytes) -> Observation:
        before = len(self.collector.items)
        t0 = time.perf_counter_ns()
        status, err = None, None
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            conn.close()
            if status >= 400:
                err = f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}"
        except socket.timeout:
            err = f"timeout: no answer within {self.timeout_s:g} s"
        except OSError as exc:
            err = f"{type(exc).__name__}: {exc}"
        latency = (time.perf_counter_ns() - t0) / 1e6
        deadline = time.monotonic() + 1.0  # the server records just after the last byte
        while len(self.collector.items) == before and time.monotonic() < deadline and err is None:
            time.sleep(0.0005)
        tr, ev = (None, None)
        if len(self.collector.items) > before:
            tr, ev = self.collector.items[-1]
        return Observation(latency, status, err, tr, ev or {})

    def concurrent(
        self, payload: Any, body: bytes, concurrency: int, requests: int, max_seconds: float
    ) -> tuple[list[Observation], float]:
        from .loadgen import LoadGenerator, Target, build_requests, error_kind

        target = Target.parse(self.url)
        raw = build_requests(target, method="POST", bodies=[body], content_type="application/json")
        before = len(self.collector.items)
        gen = LoadGenerator(target, raw, timeout_s=self.timeout_s)
        t0 = time.perf_counter()
        async def run() -> list[Any]:
            task = asyncio.ensure_future(gen.closed_loop(concurrency=concurrency, requests=requests))
            done, _ = await asyncio.wait({task}, timeout=max_seconds)
            if not done:
                gen.stop()
            return await task

        results = asyncio.run(run())
        elapsed = time.perf_counter() - t0
        traces = self.collector.items[before:]
        obs = []
        for i, r in enumerate(results):
            err = error_kind(r)
            tr, ev = traces[i] if i < len(traces) else (None, None)
            obs.append(Observation((r[2] - r[1]) / 1e6, r[3] or None, err, tr, ev or {}))
        return obs, elapsed


class _EvidenceASGI:
    """Sets a fresh evidence dict for each request; starts the loop-lag monitor once."""

    def __init__(self, app: Any, lag_ms: list[float]) -> None:
        self.app = app
        self.lag_ms = lag_ms
        self._monitor: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._monitor is None:
                self._monitor = asyncio.ensure_future(_lag_monitor(self.lag_ms))
            token = set_evidence(new_evidence())
            try:
                await self.app(scope, receive, send)
            finally:
                from .probes import _evidence

                _evidence.reset(token)
        else:
            await self.app(scope, receive, send)


class ASGITarget(_HTTPTarget):
    kind = "asgi"

    def __init__(self, app: Any, path: str, timeout_s: float) -> None:
        super().__init__(path, timeout_s)
        inner = ServescopeMiddleware(app, exporters=[self.collector], server_timing=True, metrics_path=None)
        self.app = _EvidenceASGI(inner, self.lag_ms)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        self.port = free_port()
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="error", access_log=False, lifespan="auto")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="servescope-uvicorn")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError("the app did not start (its start-up failed: run it alone to see why)")
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
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # the doctor reports; no access log
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class WSGITarget(_HTTPTarget):
    kind = "wsgi"

    def __init__(self, app: Any, path: str, timeout_s: float) -> None:
        super().__init__(path, timeout_s)
        inner = ServescopeWSGIMiddleware(app, exporters=[self.collector], server_timing=True, metrics_path=None)

        def with_evidence(environ: dict[str, Any], start_response: Any) -> Any:
            set_evidence(new_evidence())  # each request has its own server thread
            return inner(environ, start_response)

        self.app = with_evidence
        self._server: Any = None

    def start(self) -> None:
        self._server = _ThreadingWSGIServer((self.host, 0), _QuietHandler)
        self._server.set_app(self.app)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="servescope-wsgi").start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _lag_monitor(out: list[float], interval: float = 0.005) -> None:
    """How late the loop wakes a task that sleeps ``interval``: time it was blocked."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(interval)
        out.append(max(0.0, (time.perf_counter() - t0 - interval) * 1000))


def _is_asgi(obj: Any) -> bool:
    call = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "__call__", None)
    if call is None:
        return False
    if type(obj).__module__.startswith(("fastapi", "starlette")):
        return True
    try:
        params = list(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        return False
    return inspect.iscoroutinefunction(call) and params[:3] == ["scope", "receive", "send"]


def _is_wsgi(obj: Any) -> bool:
    if type(obj).__module__.startswith("flask") or hasattr(obj, "wsgi_app"):
        return True
    try:
        params = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return False
    return params[:2] == ["environ", "start_response"]


def make_target(obj: Any, *, path: str, timeout_s: float) -> Any:
    """The right target for what the user pointed at."""
    if _is_asgi(obj):
        return ASGITarget(obj, path, timeout_s)
    if _is_wsgi(obj):
        return WSGITarget(obj, path, timeout_s)
    if callable(obj) and not isinstance(obj, type):
        return FunctionTarget(obj, timeout_s)
    raise ConfigError(f"{obj!r} is neither a callable handler nor an ASGI/WSGI app")


def payload_bytes(payload: Any) -> bytes:
    return orjson.dumps(payload)
