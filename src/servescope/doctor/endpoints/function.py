"""A plain callable, called with the parsed payload in the doctor's process.

``def`` handlers run on daemon worker threads (a handler that never returns is abandoned
and cannot keep the process alive); ``async def`` handlers run on one event loop in a
daemon thread, as a server would run them.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

import orjson

from ...timing import Trace
from ..context import end_evidence
from ..probes import new_evidence, set_evidence
from .loop_watch import LoopWatch
from .base import Observation
from .client import in_turn

__all__ = ["FunctionEndpoint", "describe_failure"]


def describe_failure(exc: BaseException) -> str:
    """The endpoint's exception as report text. ``SystemExit`` and ``KeyboardInterrupt``
    raised by a handler are its failures too, not a reason for the doctor to stop."""
    if isinstance(exc, _HandlerExit):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"SystemExit: the handler called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


class _HandlerExit(Exception):
    """``SystemExit``/``KeyboardInterrupt`` from an ``async def`` handler, carried as a plain
    exception: raised as they are, they would stop the event loop every handler runs on."""


class DaemonPool:
    """Worker threads that are daemons: the doctor can always exit, whatever a handler does.
    Grows on demand up to ``size``; a thread stuck in a handler is simply lost. The next job
    goes to the thread that came free last, as a server's worker takes one caller's requests
    in turn (threads taken in turn move the request's work from core to core: see
    endpoints/wsgi_server.py for what that cost an ONNX Runtime session)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]] = []  # (the last one came free last)
        self._waiting: list[tuple[Future[Any], Callable[[], Any]]] = []  # (jobs while every thread is busy, at ``size``)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            if self._idle:
                self._idle.pop().put((fut, fn))
            elif len(self._threads) < self.size:
                inbox: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
                inbox.put((fut, fn))
                t = threading.Thread(target=self._work, args=(inbox,), daemon=True, name=f"servescope-call-{len(self._threads)}")
                self._threads.append(t)
                t.start()
            else:
                self._waiting.append((fut, fn))
        return fut

    def _work(self, inbox: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            fut, fn = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: B036 - the handler's failure is data
                    fut.set_exception(exc)
            with self._lock:
                if self._closed:
                    return
                if self._waiting:
                    inbox.put(self._waiting.pop(0))
                else:
                    self._idle.append(inbox)

    def shutdown(self) -> None:
        """Every thread ends once its job does (one that never returns stays lost)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._waiting.clear()
        for inbox in idle:
            inbox.put(None)


class FunctionEndpoint:
    kind = "function"

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        # an `async def` generator streams on the loop, as a server iterates one
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
        self._pool = DaemonPool(32)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        #: run an ``async def`` handler on a worker thread with a loop of its own, not on the
        #: shared loop (the off-the-loop experiment: what a plain ``def`` handler would do)
        self.off_loop = False
        self.loop_watch = LoopWatch()
        self.load_from = "this process: a function's callers are its threads"

    @property
    def loop_thread_id(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    def routes(self) -> list[tuple[str, list[str]]]:
        return []

    def start(self, timeout_s: float) -> None:
        if self.is_async:  # async handlers run on one event loop, as a server would
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="servescope-loop")
            self._thread.start()
            asyncio.run_coroutine_threadsafe(self.loop_watch.run(), self._loop)

    def stop(self) -> None:
        loop = self._loop
        if loop is not None:

            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(1)
            except BaseException:  # noqa: B036 - a handler that holds the loop: leave it to the daemon thread
                pass
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(1)
            if not loop.is_running():
                loop.close()
        self._pool.shutdown()

    def one_by_one(self, body: bytes, n: int, timeout_s: float, max_seconds: float, path: str | None = None) -> list[Observation]:
        return in_turn([lambda: self.request(body, timeout_s)] * n, max_seconds)

    def request(self, body: bytes, timeout_s: float, path: str | None = None) -> Observation:
        payload = orjson.loads(body)  # each call its own copy, as a server parses each body
        ev = new_evidence()
        tr = Trace()
        t0 = time.perf_counter_ns()
        first: list[int] = []  # a streamed answer: when each item came
        if self.is_async and not self.off_loop:
            assert self._loop is not None

            async def run() -> Any:
                set_evidence(ev)
                with tr:
                    try:
                        return await _drain_async(_call_async(self.fn, payload), first)
                    except (SystemExit, KeyboardInterrupt) as exc:
                        raise _HandlerExit(describe_failure(exc)) from None

            fut: Any = asyncio.run_coroutine_threadsafe(run(), self._loop)
        else:
            fn, is_async = self.fn, self.is_async

            def run_sync() -> Any:
                set_evidence(ev)
                with tr:
                    if is_async:  # (off the loop: a loop of its own, on this worker thread)
                        return asyncio.run(_drain_async(_call_async(fn, payload), first))
                    return _drain(fn(payload), first)

            fut = self._pool.submit(lambda: contextvars.copy_context().run(run_sync))
        err, answer = None, None
        try:
            answer = fut.result(timeout_s)
        except (FutureTimeout, TimeoutError):
            fut.cancel()
            err = f"timeout: no answer within {timeout_s:.3g} s"
        except BaseException as exc:  # noqa: B036 - SystemExit/KeyboardInterrupt from the handler
            err = describe_failure(exc)
        end_evidence(ev)
        latency = (time.perf_counter_ns() - t0) / 1e6
        first_ms = (first[0] - t0) / 1e6 if first else None
        gaps = [(b - a) / 1e6 for a, b in zip(first, first[1:])]
        return Observation(latency, None, err, tr if tr.total_ns is not None else None, ev, answer, first_ms, gaps)

    def ready_load(self) -> None:
        pass  # (its callers are threads of this process)

    def concurrent_from_outside(self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float) -> None:
        return None  # (a function can only be called in this process)

    def concurrent(
        self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Observation], float]:
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        obs: list[Observation] = []
        lock = threading.Lock()
        budget = [requests]

        def caller() -> None:
            while True:
                with lock:
                    if budget[0] <= 0 or time.perf_counter() > deadline:
                        return  # new requests start until the budget is spent ...
                    budget[0] -= 1
                o = self.request(body, timeout_s)  # ... each with the whole timeout
                with lock:
                    obs.append(o)
                if o.error and o.error.startswith("timeout"):
                    return  # this caller's handler thread is stuck

        threads = [threading.Thread(target=caller, daemon=True, name="servescope-caller") for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(deadline - time.perf_counter(), 0) + timeout_s + 1)
        with lock:
            return list(obs), time.perf_counter() - t0


async def _call_async(fn: Callable[..., Any], payload: Any) -> Any:
    """What an ``async def`` handler answers: its return value, or the async generator it is."""
    out = fn(payload)
    return await out if inspect.isawaitable(out) else out


def _drain(out: Any, first: list[int]) -> Any:
    """A handler that returns a generator streams its answer: read it to its end, as a server
    sends it, noting when each item came (the items are the answer)."""
    if not inspect.isgenerator(out):
        return out
    items = []
    for item in out:
        first.append(time.perf_counter_ns())
        items.append(item)
    return items


async def _drain_async(answer: Any, first: list[int]) -> Any:
    out = await answer
    if inspect.isasyncgen(out):
        items = []
        async for item in out:
            first.append(time.perf_counter_ns())
            items.append(item)
        return items
    return _drain(out, first)
