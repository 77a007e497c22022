"""The doctor's WSGI server: each request on a thread of a pool, and the thread that came
free last waits on the listening socket itself, as a gunicorn worker does.

    server = LeaderWSGIServer(("127.0.0.1", 0), handler_class)
    server.set_app(app)
    server.start()   # its first thread waits for a connection
    ...
    server.stop()    # (then server_close())

Why not an accepting thread that hands each connection to the pool: the kernel puts the
thread it wakes near the one that woke it, and an ONNX Runtime session built per request
(its threads pinned to cores) then ran on its pinned thread's core in 60-70% of the
requests, 2-5 ms slower each, where gunicorn's worker, woken by the connection itself, stayed
off it in 95-99%. The doctor counted that in the loader's saving (4.4-4.6 ms against 2.5
realized). A thread for every request (``ThreadingMixIn``) cost more still: 3-6 ms a request.

Under concurrency the thread that accepted a connection first hands the socket to the next
idle thread (a new one if none, up to ``MAX_THREADS``), then serves; once done, it takes the
socket back. Each request runs in a context of its own, as on a new thread.

In the doctor's child the first thread is the process's main thread (``main_thread.py``), and
it leads whenever it is free: requests sent one at a time all run on it, as under gunicorn's
sync worker (a connection that comes while it still finishes the last request waits up to
``MAIN_GRACE_S`` for it); requests at once run on threads as well, as under ``--threads``.
"""

from __future__ import annotations

import contextvars
import select
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIServer

from .main_thread import MainJob, on_main_thread

__all__ = ["LeaderWSGIServer"]


class _Worker:
    def __init__(self, server: LeaderWSGIServer, n: int) -> None:
        self.woken = threading.Event()  # set when it is to lead (or the server stops)
        self.wake_r, self.wake_w = socket.socketpair()  # a byte: stop waiting on the socket, another leads
        # the first on the process's main thread where it is lent, as a sync worker's requests (main_thread.py)
        self.thread: threading.Thread | MainJob | None = on_main_thread(lambda: server._work(self)) if n == 0 else None
        self.on_main = self.thread is not None
        if self.thread is None:
            self.thread = threading.Thread(target=server._work, args=(self,), daemon=True, name=f"servescope-call-{n}")
            self.thread.start()


class LeaderWSGIServer(WSGIServer):
    MAX_THREADS = 256  # (grown on demand; a handler that never returns keeps its thread)
    #: while requests come one at a time, a connection that comes while the main thread is still
    #: finishing the last (its client has the answer; the server has not let go of it) waits up to
    #: this long for the main thread, as under a sync worker, then is taken by the thread that leads
    MAIN_GRACE_S = 0.25

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.socket.setblocking(False)  # (two threads may wake for one connection: one gets it)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []  # (the last came free last)
        self._leader: _Worker | None = None
        self._closed = False
        self.one_at_a_time = True  # (the doctor says when it sends at concurrency)
        self._main_serving = False
        self._main_overdue = False  # (a grace ran out while it was still busy: no more waiting for it until it is free)

    def start(self) -> None:
        with self._lock:
            self._leader = self._spawn()

    def _hand_lead(self) -> None:  # (under the lock)
        """The next idle thread waits on the socket (a new one if none, up to ``MAX_THREADS``)."""
        self._leader = self._idle.pop() if self._idle else (self._spawn() if len(self._workers) < self.MAX_THREADS else None)
        if self._leader is not None:
            self._leader.woken.set()

    def _spawn(self) -> _Worker:  # (under the lock)
        w = _Worker(self, len(self._workers))
        self._workers.append(w)
        return w

    def _work(self, me: _Worker) -> None:
        try:
            self._serve(me)
        finally:
            with self._lock:  # (a thread that ended on an error hands on the lead: the socket is never left unwatched)
                if me.on_main:
                    self._main_serving, self._main_overdue = False, False
                if me in self._idle:
                    self._idle.remove(me)
                if self._leader is me and not self._closed:
                    self._hand_lead()
            me.wake_r.close()
            me.wake_w.close()

    def _serve(self, me: _Worker) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                leading = self._leader is me
                if not leading:
                    me.woken.clear()
                    self._idle.append(me)
            if not leading:
                me.woken.wait()
                continue
            got = self._accept(me)
            if got is None:
                continue
            contextvars.Context().run(self._one, *got)
            with self._lock:  # done: it came free last, so it waits on the socket again (the main thread first)
                if me.on_main:
                    self._main_serving, self._main_overdue = False, False
                if self._closed:
                    return
                before, first = self._leader, self._workers[0]
                if first is not me and first.on_main and (first is before or first in self._idle):
                    if first in self._idle:
                        self._idle.remove(first)
                        first.woken.set()
                    self._leader = first
                else:
                    self._leader = me
            if before is not None and before is not me and before is not self._leader:
                _wake(before)  # (it goes idle, on top: it came free before this one)

    def _accept(self, me: _Worker) -> tuple[Any, Any] | None:
        """A connection, once this thread leads; None once another leads or the server stops.
        (``poll``, not ``select``: a process with over 1024 files open is no reason to fail.)"""
        poller = select.poll()
        try:
            listening = self.socket.fileno()
            poller.register(listening, select.POLLIN)
            poller.register(me.wake_r, select.POLLIN)
        except (OSError, ValueError):  # (the socket closed: the server is done)
            with self._lock:
                self._closed = True
            return None
        seen = 0.0  # when a connection came that waits for the main thread
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if me.wake_r.fileno() in ready:
                me.wake_r.recv(64)
            with self._lock:
                if self._closed or self._leader is not me:
                    return None
            if listening not in ready:
                continue
            if self._main_busy(me):
                seen = seen or time.monotonic()
            wait = seen + self.MAIN_GRACE_S - time.monotonic() if seen else 0.0
            if seen and wait <= 0:
                with self._lock:
                    self._main_overdue = True
            if wait > 0:
                poller.unregister(listening)  # (only a wake-up now: the main thread comes free, or the grace ends)
                poller.poll(wait * 1000)
                poller.register(listening, select.POLLIN)
                continue
            try:
                request, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                continue  # (another thread took it)
            except OSError:  # (out of files, say: not a reason to spin)
                time.sleep(0.01)
                continue
            request.setblocking(True)
            with self._lock:  # the next idle thread waits on the socket while this one serves
                if me.on_main:
                    self._main_serving = True
                if self._leader is me:
                    self._hand_lead()
            return request, address

    def _main_busy(self, me: _Worker) -> bool:
        """Requests come one at a time and the main thread, not this one, is still on the last."""
        with self._lock:
            return self.one_at_a_time and not me.on_main and self._main_serving and not self._main_overdue

    def _one(self, request: Any, client_address: Any) -> None:
        try:
            if self.verify_request(request, client_address):
                self.finish_request(request, client_address)
        except BaseException:  # noqa: B036 - the app's failure (a sys.exit too) is its request's, not the thread's
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def stop(self) -> None:
        """Every thread ends once its request does (one that never returns stays lost)."""
        with self._lock:
            self._closed = True
            workers = list(self._workers)
        for w in workers:
            w.woken.set()
            _wake(w)


def _wake(w: _Worker) -> None:
    try:
        w.wake_w.send(b"x")
    except OSError:  # (it has ended: its socket is closed)
        pass
