"""The process's main thread, lent to the app's server, as uvicorn and gunicorn's worker use it.

uvicorn runs its event loop (and so every ``async def`` route) on the main thread, and gunicorn's
default sync worker and uWSGI run each request there. glibc gives the main thread its main heap,
which gets memory from the system and hands it back differently from a thread's own heap: an
ONNX Runtime session built per request cost 111-124 ms a request more than one built once when
the request ran on the main thread (gunicorn's sync worker; an ``async def`` route under uvicorn),
and 83-92 ms more on a pool's thread (a ``def`` route, gunicorn ``--threads``). A doctor that served
on threads only measured the first kind's saving at 0.74-0.80 of it.

So in the doctor's processes that serve the app (``child.py``; the fresh ones of ``cold.py`` and
``fresh.py``) the run goes on a thread of its own and the main thread waits here for what the
app's server hands it:

    lend_main_thread(run)                 # on the main thread: run() on a thread; returns when it does

    job = on_main_thread(server.run)      # from the run's thread: None where no main thread is lent
    job.ident, job.is_alive(), job.join(2)
    module = call_on_main_thread(load_target, spec)   # waits; its result, or raises its error

One job at a time: a server whose loop never returned keeps the main thread, and the next
server asks in vain (``None``: it runs on a thread of its own, as before).
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["MainThread", "MainJob", "call_on_main_thread", "lend_main_thread", "on_main_thread"]


class MainJob:
    """A function running on the main thread; waited for like a thread."""

    def __init__(self, fn: Callable[[], Any], report: bool = True) -> None:
        self.fn, self.report = fn, report  # (report: its error to stderr, where no caller reads it)
        self.ident = threading.main_thread().ident
        self._done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: B036 - the server's failure is its own (and its starter sees it ended)
            self.error = exc
            if self.report and not isinstance(exc, SystemExit):
                traceback.print_exception(exc, file=sys.stderr)


class MainThread:
    _lent: MainThread | None = None

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[MainJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = False

    @classmethod
    def install(cls) -> MainThread:
        assert threading.current_thread() is threading.main_thread()
        cls._lent = cls()
        return cls._lent

    def host(self) -> None:
        """Run what is handed over, one at a time, until the process ends (``os._exit``) or
        ``close``."""
        while True:
            try:
                job = self._jobs.get()
            except BaseException:  # noqa: B036 - a signal's handler raising here must not end the run mid-way
                traceback.print_exc()
                continue
            if job is None:
                return
            job._run()
            with self._lock:  # (free before it is seen done: its caller may hand over the next at once)
                self._busy = False
            job._done.set()

    def close(self) -> None:
        """``host`` returns once its job does; nothing more is lent."""
        if MainThread._lent is self:
            MainThread._lent = None
        self._jobs.put(None)

    def take(self, fn: Callable[[], Any], report: bool = True) -> MainJob | None:
        with self._lock:
            if self._busy:
                return None
            self._busy = True
        job = MainJob(fn, report)
        self._jobs.put(job)
        return job


def on_main_thread(fn: Callable[[], Any], report: bool = True) -> MainJob | None:
    """``fn`` on the process's main thread where it is lent and free; else None."""
    lent = MainThread._lent
    if lent is None or threading.current_thread() is threading.main_thread():
        return None
    return lent.take(fn, report)


def call_on_main_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, on the main thread where it is lent and free (as a server imports its app), waited for."""
    job = on_main_thread(lambda: fn(*args), report=False)
    if job is None:
        return fn(*args)
    job.join()
    if job.error is not None:
        raise job.error
    return job.result


def lend_main_thread(run: Callable[[], None]) -> None:
    """``run()`` on a thread of its own while the main thread runs what the app's server hands
    it; returns once ``run`` has (and the main thread's job, if any, with it), unless ``run``
    ends the process first (``os._exit``, as the doctor's processes do)."""
    host = MainThread.install()

    def body() -> None:
        try:
            run()
        finally:
            host.close()

    threading.Thread(target=body, daemon=True, name="servescope-doctor").start()
    host.host()
