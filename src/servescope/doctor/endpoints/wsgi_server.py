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
"""

from __future__ import annotations

import contextvars
import select
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIServer

__all__ = ["LeaderWSGIServer"]


class _Worker:
    def __init__(self, server: LeaderWSGIServer, n: int) -> None:
        self.woken = threading.Event()  # set when it is to lead (or the server stops)
        self.wake_r, self.wake_w = socket.socketpair()  # a byte: stop waiting on the socket, another leads
        self.thread = threading.Thread(target=server._work, args=(self,), daemon=True, name=f"servescope-call-{n}")


class LeaderWSGIServer(WSGIServer):
    MAX_THREADS = 256  # (grown on demand; a handler that never returns keeps its thread)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.socket.setblocking(False)  # (two threads may wake for one connection: one gets it)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []  # (the last came free last)
        self._leader: _Worker | None = None
        self._closed = False

    def start(self) -> None:
        with self._lock:
            self._leader = self._spawn()

    def _spawn(self) -> _Worker:  # (under the lock)
        w = _Worker(self, len(self._workers))
        self._workers.append(w)
        w.thread.start()
        return w

    def _work(self, me: _Worker) -> None:
        try:
            self._serve(me)
        finally:
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
            with self._lock:  # done: it came free last, so it waits on the socket again
                if self._closed:
                    return
                before, self._leader = self._leader, me
            if before is not None and before is not me:
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
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if me.wake_r.fileno() in ready:
                me.wake_r.recv(64)
            with self._lock:
                if self._closed or self._leader is not me:
                    return None
            if listening not in ready:
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
                if self._leader is me:
                    self._leader = self._idle.pop() if self._idle else (self._spawn() if len(self._workers) < self.MAX_THREADS else None)
                    if self._leader is not None:
                        self._leader.woken.set()
            return request, address

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
