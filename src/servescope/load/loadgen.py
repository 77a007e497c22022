"""The load generator: HTTP/1.1 keep-alive connections driven closed-loop or open-loop.

It shares two CPU cores with the server it measures, so its own cost per request matters:
requests are pre-encoded bytes, responses are parsed by httptools (llhttp, in C) on plain
asyncio protocols, completions are callbacks (no coroutine or future per request), and
``Server-Timing`` headers are kept as raw bytes and parsed only after the run.

Open loop (``rate``): request k is *scheduled* at ``start + k / rate`` (or at Poisson arrival
times) and its latency is measured from that scheduled time, as wrk2 does: a server that
stalls cannot hide its stall by slowing the generator down (coordinated omission). The
latency from the actual send is kept as well ("uncorrected").

Streamed responses (chunked transfer encoding, or ``text/event-stream``) also keep when their
head arrived and when each chunk (for Server-Sent Events: each event carrying ``data``)
arrived, one clock read per chunk; a plain response pays only for two header-name lengths
compared. ``results.results_report`` turns these into TTFB, TTFT and inter-chunk gaps.

OpenAI-compatible endpoints (``openai=True``): an event is a token only when it carries text,
and the event with the ``usage`` object (or a plain answer's last 64 KiB) is kept and read
once, when the response is complete (``usage``); other runs pay nothing for this.

The plain data it sends and keeps (``URL``, ``Result``, ``build_requests`` ...) is ``wire.py``,
importable from here as before; one connection's protocol is ``conn.py``.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Any, Callable


from ..exceptions import ConfigError
from .conn import ERROR_BODY_BYTES, OPENAI_TAIL_BYTES, _Conn  # noqa: F401 - (the constants: importable from here as before)
# in this module's globals, where the per-response path looks them up (and importable from here)
from .wire import (
    CHUNKED,
    MAX_SERVER_TIMING_BYTES,
    OUTPUT,
    OVERSIZED,
    SSE,
    URL,
    USAGE,
    Result,
    _connect_error,
    _tcp,
    build_requests,
    error_kind,
    ok_latencies_ms,
    schedule,
    streamed,
    usage,
)

__all__ = [
    "CHUNKED", "MAX_SERVER_TIMING_BYTES", "OUTPUT", "OVERSIZED", "SSE", "LoadGenerator", "Result", "URL",
    "build_requests", "error_kind", "ok_latencies_ms", "schedule", "streamed", "usage",
]  # fmt: skip

_EARLY_NS = 200_000
#: Open loop: a request sent on a free connection later than this after it was due counts from
#: its due time (the generator was held up: by its own work, or by a CPU the server took from
#: it, which a user on another machine would not have waited for); sent within it, from the
#: send itself: the timer's own jitter (a sleep wakes up to ~1 ms late) is not the server's time.
#: A request that waited for a connection always counts from its due time.
LATE_NS = 1_000_000

#: After ``stop()`` (Ctrl-C), how long the requests under way get to finish, in seconds; a run
#: that ends on its own gives each its whole timeout (the requests due in it all count).
STOP_DRAIN_S = 2.0
def counted_from(due: int, now: int) -> int | None:
    """What an open loop's request sent at ``now`` on a free connection counts from: its due
    time when the send is more than ``LATE_NS`` late, else its send (None)."""
    return due if now - due > LATE_NS else None


class LoadGenerator:
    """Sends ``requests`` (cycled) to ``target``; collects one ``Result`` per request.

        gen = LoadGenerator(URL.parse(url), build_requests(...))
        results = asyncio.run(gen.closed_loop(concurrency=8, duration_s=10))
    """

    def __init__(
        self,
        target: URL,
        requests: list[bytes],
        *,
        timeout_s: float = 30.0,
        max_connections: int = 1024,
        on_tick: Callable[[LoadGenerator], None] | None = None,
        max_server_timing_bytes: int = MAX_SERVER_TIMING_BYTES,
        openai: bool = False,
        keep_answers: bool = False,
    ) -> None:
        if not requests:
            raise ConfigError("no request to send")
        if not isinstance(max_server_timing_bytes, int) or max_server_timing_bytes < 0:
            raise ConfigError(f"max_server_timing_bytes must be a whole number >= 0, got {max_server_timing_bytes!r}")
        self.max_server_timing_bytes = max_server_timing_bytes
        #: an OpenAI-compatible endpoint: tokens are events with text, ``Result.usage`` is read
        self.openai = openai
        #: sessions: each answer's text is kept (``_Conn.last_answer``) to carry into the next turn
        self.keep_answers = keep_answers
        #: "HTTP 422: <its body>" for the first answer >= 400 of the run, to say why requests fail
        self.first_error_body: str | None = None
        self.target = target
        self.requests = requests
        self.timeout_ns = round(timeout_s * 1e9)
        self.max_connections = max_connections
        self.on_tick = on_tick
        self.results: list[Result] = []
        self.conns: list[_Conn] = []
        self.idle: list[_Conn] = []
        self.pending: collections.deque[int] = collections.deque()  # scheduled_ns waiting for a connection
        self.connecting = 0
        self.running = False
        self.in_flight = 0
        self.sent = 0
        self.lags: list[int] = []  # open loop: how late the scheduler dispatched each request
        self.stopped = False
        self.stopped_ns: int | None = None
        self._stop_event: asyncio.Event | None = None
        self._next = 0
        self._ssl = ssl.create_default_context() if target.scheme == "https" else None
        self._addresses: list[Any] | None = None
        #: how long the host's name took to look up (once a run), ns
        self.dns_ns: int | None = None
        #: each connection opened: its TCP handshake and its TLS handshake (0 for http), ns
        self.connects: list[tuple[int, int]] = []
        self._mode = "closed"
        self._limit: int | None = None
        self._fast = False  # closed loop running below its limit: completions send inline
        self._drained: asyncio.Future[None] | None = None
        self._draining = False  # the level's load ended; waiting for what is still under way
        self._drain_implicit = False  # the drain is the timeout's: stop() cuts it to STOP_DRAIN_S
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- connections -------------------------------------------------------------------------
    async def _connect(self) -> _Conn:
        """A new connection, its phases timed: the name looked up (once a run: ``dns_ns``), the
        TCP handshake and the TLS one (``connects``)."""
        loop = asyncio.get_running_loop()
        target = self.target
        if self._addresses is None:
            t0 = time.perf_counter_ns()
            self._addresses = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            self.dns_ns = time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        sock = await _tcp(loop, self._addresses)
        t1 = time.perf_counter_ns()
        try:
            _, conn = await loop.create_connection(
                lambda: _Conn(self), sock=sock, ssl=self._ssl, server_hostname=target.host if self._ssl else None
            )
        except BaseException:
            sock.close()
            raise
        self.connects.append((t1 - t0, time.perf_counter_ns() - t1 if self._ssl else 0))
        self.conns.append(conn)
        return conn

    def _send(self, conn: _Conn, scheduled_ns: int | None) -> None:
        self.sent += 1
        self.in_flight += 1
        reqs = self.requests
        i = self._next % len(reqs)
        self._next += 1
        conn.send(reqs[i], [scheduled_ns, 0], i)

    def _complete(self, conn: _Conn, result: Result) -> None:
        self.results.append(result)
        self.in_flight -= 1
        if not self.running:
            if self._sends_after_schedule() and self.pending:  # open loop: what waited for a connection goes out
                if conn.open:
                    self._send(conn, self.pending.popleft())
                else:
                    self._spawn_connect()
            self._check_drained()
            return
        if self._mode == "closed":
            if self._limit is not None and self.sent >= self._limit:
                if conn.open:
                    self.idle.append(conn)
            elif conn.open:
                self._send(conn, None)
            else:
                self._spawn(self._reconnect_and_send(delay=result.error is not None))
        elif self.pending:
            if conn.open:
                self._send(conn, self.pending.popleft())
            else:
                self._spawn_connect()
        elif conn.open:
            self.idle.append(conn)

    def _sends_after_schedule(self) -> bool:
        """Open loop after its schedule ended: requests due in it that waited for a connection
        are still sent (their latency counts from when they were due), unless it was stopped."""
        return self._mode == "open" and self._draining and not self.stopped

    def _busy(self) -> bool:
        """Something to wait for: a request in flight, or one pending that a connection on
        its way can still send."""
        return self.in_flight > 0 or bool(self.pending and self.connecting and self._sends_after_schedule())

    def _check_drained(self) -> None:
        if self._drained is not None and not self._drained.done() and not self._busy():
            self._drained.set_result(None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconnect_and_send(self, delay: bool = False) -> None:
        if delay:  # a dead server: do not spin
            await asyncio.sleep(0.01)
        scheduled = time.perf_counter_ns()
        try:
            conn = await self._connect()
        except (OSError, asyncio.TimeoutError) as exc:
            self.results.append(Result(scheduled, scheduled, time.perf_counter_ns(), 0, None, _connect_error(exc)))
            if self.running:
                self._spawn(self._reconnect_and_send(delay=True))
            return
        # (several connections closed by the server at once each come here: the limit is
        # checked as the request goes out, or a closed loop sends one per closing connection too many)
        if self.running and (self._limit is None or self.sent < self._limit):
            self._send(conn, None)
        else:
            self.idle.append(conn)
            self._check_drained()

    def _spawn_connect(self) -> None:
        """Open a connection for the pending requests; counted as connecting from now on."""
        self.connecting += 1
        self._spawn(self._open_and_dispatch())

    async def _open_and_dispatch(self) -> None:
        try:
            conn = await self._connect()
        except (OSError, asyncio.TimeoutError) as exc:
            if self.pending:
                sched = self.pending.popleft()
                index = self._next % len(self.requests)  # its request, so the next due keeps its own
                self._next += 1
                self.results.append(Result(sched, sched, time.perf_counter_ns(), 0, None, _connect_error(exc), None, index))
            self._check_drained()
            return
        finally:
            self.connecting -= 1
        if self.pending and (self.running or self._sends_after_schedule()):
            self._send(conn, self.pending.popleft())
        else:
            self.idle.append(conn)
            self._check_drained()

    # -- housekeeping ------------------------------------------------------------------------
    async def _sweep(self) -> None:
        """Time out requests that took too long; tick the progress display."""
        while True:
            await asyncio.sleep(0.1)
            now = time.perf_counter_ns()
            for conn in self.conns:
                cur = conn.cur
                if cur is not None and now - cur[1] > self.timeout_ns:
                    conn._drop("timeout")
            if len(self.conns) > 64:
                self.conns = [c for c in self.conns if c.open or c.cur is not None]
            if self.on_tick is not None:
                self.on_tick(self)

    async def _finish(self, drain_s: float | None) -> None:
        """Wait for the requests in flight (open loop: and those still waiting for a
        connection), up to ``drain_s`` (default: the request timeout + 0.5 s, so each ends
        answered or timed out; after ``stop()``, STOP_DRAIN_S); a request sent and still
        unanswered then counts as failed, ``unfinished at the end``, unless the run was
        stopped (Ctrl-C: what completed is kept, the rest left out)."""
        self.running = False
        self._fast = False
        self._drain_implicit = drain_s is None
        if drain_s is None:
            drain_s = STOP_DRAIN_S if self.stopped else self.timeout_ns / 1e9 + 0.5
        self._draining = True
        if self._busy():
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._drained, drain_s)
            except asyncio.TimeoutError:
                pass
        self._draining = False
        for task in list(self._tasks):  # reconnects still waiting on a dead server
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self.conns:
            if conn.cur is not None:
                if self.stopped:
                    conn.cur = None  # interrupted, not failed: left out
                else:
                    conn._drop("unfinished at the end")
        for conn in self.conns + self.idle:
            if conn.transport is not None:
                conn.transport.close()

    def stop(self) -> None:
        """End the run early (Ctrl-C): no new requests; those under way get STOP_DRAIN_S (or
        the ``drain_s`` given) to finish; what completed so far is kept."""
        self.stopped = True
        self.stopped_ns = time.perf_counter_ns()  # where the measured window ends (not after the drain)
        self._fast = False
        if self._stop_event is not None:
            self._stop_event.set()
        if self._drain_implicit and self._drained is not None and not self._drained.done():
            asyncio.get_running_loop().call_later(STOP_DRAIN_S, self._end_drain)

    def _end_drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def progress_since(self, seen: int) -> tuple[int, int, list[float]]:
        """For a live view: requests completed so far, and among those after the first ``seen``:
        how many failed, and the successes' latencies (ms)."""
        results = self.results
        n = len(results)
        window = results[seen:n]
        ok = ok_latencies_ms(window)
        return n, len(window) - len(ok), ok

    # -- drivers -----------------------------------------------------------------------------
    async def closed_loop(self, *, concurrency: int, duration_s: float | None = None, requests: int | None = None, drain_s: float | None = None) -> list[Result]:
        """``concurrency`` requests always in flight, for ``duration_s`` or about ``requests``."""
        self._mode = "closed"
        self._limit = requests
        self.running = True
        self._fast = requests is None or requests > concurrency
        sweeper = asyncio.ensure_future(self._sweep())
        try:
            start = time.perf_counter_ns()
            for _ in range(concurrency if requests is None else min(concurrency, requests)):
                self._spawn(self._reconnect_and_send())
            await self._wait(start, duration_s, requests)
        finally:
            try:
                await self._finish(drain_s)  # the sweeper still times out what hangs
            finally:
                sweeper.cancel()
        return self.results

    async def open_loop(self, *, rate: float | None = None, duration_s: float | None = None, requests: int | None = None, poisson: bool = False, seed: int | None = None, drain_s: float | None = None, offset_ns: int = 0, offsets_ns: list[int] | None = None) -> list[Result]:
        """Requests sent on a fixed schedule at ``rate``/s, whatever the server does; the first
        one ``offset_ns`` after the start (generators sharing a rate interleave this way). Or at
        ``offsets_ns`` from the start, one request each (a trace replayed), ``requests`` in
        order: the k-th due gets the k-th request."""
        self._mode = "open"
        self.running = True
        sweeper = asyncio.ensure_future(self._sweep())
        for _ in range(min(self.max_connections, 4)):  # a few connections ready before the clock starts
            try:
                self.idle.append(await self._connect())
            except (OSError, asyncio.TimeoutError):
                break
        start = time.perf_counter_ns()
        end = start + round(duration_s * 1e9) if duration_s is not None else None
        try:
            times = (start + o for o in offsets_ns) if offsets_ns is not None else schedule(rate or 0.0, start + offset_ns, poisson=poisson, seed=seed)
            for k, due in enumerate(times):
                if (end is not None and due >= end) or (requests is not None and k >= requests) or self.stopped:
                    break
                now = time.perf_counter_ns()
                # the loop's timers are coarse (1 ms under uvloop): wake a little early and send
                # on time; latency counts from the earlier of the schedule and the actual send
                if due - now > _EARLY_NS:
                    await asyncio.sleep((due - now - _EARLY_NS) / 1e9)
                    now = time.perf_counter_ns()
                self.lags.append(now - due)  # > 0: the generator itself is late
                if self.idle:
                    conn = self.idle.pop()
                    if conn.open:
                        self._send(conn, counted_from(due, now))
                        continue
                self.pending.append(due)
                if len(self.conns) + self.connecting < self.max_connections:
                    self._spawn_connect()
        finally:
            try:
                await self._finish(drain_s)  # the sweeper still times out what hangs
            finally:
                sweeper.cancel()
        for sched in self.pending:  # never sent: they count, as failures of the run
            index = self._next % len(self.requests)
            self._next += 1
            self.results.append(Result(sched, sched, time.perf_counter_ns(), 0, None, "not sent", None, index))
        self.pending.clear()
        return self.results

    async def _wait(self, start: int, duration_s: float | None, requests: int | None) -> None:
        self._stop_event = asyncio.Event()
        if self.stopped:
            return
        if duration_s is not None:
            remaining = max(0.0, duration_s - (time.perf_counter_ns() - start) / 1e9)
            try:
                await asyncio.wait_for(self._stop_event.wait(), remaining)
            except asyncio.TimeoutError:
                pass
            return
        while len(self.results) < (requests or 0) and not self.stopped:
            await asyncio.sleep(0.005)


def __getattr__(name: str) -> Any:
    if name == "Target":  # its name until 0.2: "target" now means what the user names on the command line
        import warnings

        warnings.warn("servescope.load.loadgen.Target is now servescope.load.loadgen.URL", DeprecationWarning, stacklevel=2)
        return URL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
