"""HTTP limits for ``servescope serve``: what one client may cost the server.

    limits = HttpLimits(max_header_bytes=64 * 1024, header_timeout_s=10, max_connections=1000)
    uvicorn.run(app, **limits.uvicorn_options())

uvicorn (with httptools, as ``uvicorn[standard]`` installs) takes request heads of any size
and waits on a head sent one byte a minute for ever. ``LimitedHttpTools`` is its protocol with
two bounds added: a head over ``max_header_bytes`` is answered 431 and the connection closed
before the rest is read, and a head (or an idle new connection) not complete within
``header_timeout_s`` is answered 408 and closed. ``max_connections`` is uvicorn's
``limit_concurrency``: beyond it, 503 at once. Body size and read time are the app's
(``max_body_bytes``, ``body_timeout_s``), so they hold under any server.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ConfigError

__all__ = ["HttpLimits", "default_max_connections"]

#: After a 431 or 408, how long what the client still sends is read and dropped before closing.
LINGER_S = 2.0


def default_max_connections() -> int:
    """1000, or fewer where the process may open fewer files (each connection is one; leave
    room for the model's own files, logs and sockets)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # pragma: no cover - every POSIX system has it
        return 1000
    return max(16, min(1000, soft - 128)) if soft != resource.RLIM_INFINITY else 1000


@dataclass(kw_only=True)
class HttpLimits:
    """Per-connection bounds, validated at construction."""

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    max_connections: int = field(default_factory=default_max_connections)

    def __post_init__(self) -> None:
        if not isinstance(self.max_header_bytes, int) or self.max_header_bytes < 1024:
            raise ConfigError(f"max_header_bytes must be a whole number >= 1024, got {self.max_header_bytes!r}")
        if not isinstance(self.header_timeout_s, (int, float)) or not 0 < self.header_timeout_s < float("inf"):
            raise ConfigError(f"header_timeout_s must be a number of seconds > 0, got {self.header_timeout_s!r}")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise ConfigError(f"max_connections must be a whole number >= 1, got {self.max_connections!r}")

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that apply these limits."""
        options: dict[str, Any] = {"limit_concurrency": self.max_connections, "h11_max_incomplete_event_size": self.max_header_bytes}
        protocol = limited_httptools(self)
        if protocol is not None:
            options["http"] = protocol
        return options


def limited_httptools(limits: HttpLimits) -> type | None:
    """uvicorn's httptools protocol with the head bounded in size and time; None where httptools
    is not installed (uvicorn then uses h11, whose own head limit ``h11_max_incomplete_event_size``
    is set; h11 has no head deadline)."""
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return None

    class LimitedHttpTools(HttpToolsProtocol):  # type: ignore[misc, valid-type]
        max_head = limits.max_header_bytes
        head_timeout = limits.header_timeout_s

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head: int | None = 0  # bytes of the head being read; None while a body is
            self._tail = b""
            self._discarding = False
            self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(self.head_timeout, self._head_too_slow)

        def data_received(self, data: bytes) -> None:
            if self._discarding:  # after a refusal: read and drop, so the answer is not lost to a reset
                return
            if self._head is not None:
                if self._head_timer is None:  # the first byte of a new head on a kept-alive connection
                    self._head_timer = self.loop.call_later(self.head_timeout, self._head_too_slow)
                end = (self._tail + data).find(b"\r\n\r\n")
                read = self._head + len(data) if end < 0 else end + 4
                if read > self.max_head:
                    self._refuse(431, f"request head over {self.max_head} bytes")
                    return
                if end < 0:
                    self._head, self._tail = read, data[-3:]
                else:
                    self._end_of_head()
            super().data_received(data)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head, self._tail = 0, b""  # what comes next on this connection is a new head

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            if any(name == b"te" and b"trailers" in value.lower() for name, value in cycle.scope["headers"]):
                cycle.scope.setdefault("extensions", {})["http.response.trailers"] = {}
                cycle.send = with_trailers(cycle)
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            self._end_of_head()
            super().connection_lost(exc)

        def _end_of_head(self) -> None:
            self._head = None
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self._head is not None and not self.transport.is_closing():
                if self._head == 0 and not self._tail:  # an idle connection that never sent a byte
                    self._end_of_head()
                    self.transport.close()
                else:
                    self._refuse(408, f"request head not complete within {self.head_timeout:g} s")

        def _refuse(self, status: int, message: str) -> None:
            self._end_of_head()
            body = message.encode()
            self.transport.write(
                STATUS_LINE[status]
                + b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            # a lingering close: the answer goes out and the write side closes, then what the
            # client is still sending is read and dropped for a moment; closing at once with
            # unread bytes would reset the connection and the client would never see the answer
            self._discarding = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    return LimitedHttpTools


def with_trailers(cycle: Any) -> Any:
    """uvicorn's ``send`` for one request-response cycle, with the ASGI ``http.response.trailers``
    extension (for a client that sent ``TE: trailers``): a response started with ``"trailers":
    True`` holds the end of its chunked body until the app's ``http.response.trailers``
    message, then ends it with those fields after the last chunk (RFC 9112, 7.1.2)."""
    send = cycle.send
    expecting = False

    async def send_with_trailers(message: dict[str, Any]) -> None:
        nonlocal expecting
        kind = message["type"]
        if kind == "http.response.start":
            expecting = bool(message.get("trailers"))
        elif expecting and kind == "http.response.body" and not message.get("more_body", False):
            if message.get("body"):
                await send({"type": "http.response.body", "body": message["body"], "more_body": True})
            return  # the body ends with the trailers
        elif kind == "http.response.trailers":
            if not expecting or cycle.response_complete:
                return
            if not cycle.chunked_encoding:  # a body of declared length: no trailers, just its end
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if cycle.flow.write_paused and not cycle.disconnected:
                await cycle.flow.drain()
            if cycle.disconnected:
                return
            fields = b"".join(name + b": " + value + b"\r\n" for name, value in message.get("headers", ()))
            cycle.transport.write(b"0\r\n" + fields + b"\r\n")
            # what uvicorn's own send does at the end of a body
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                cycle.transport.close()
            cycle.on_response()
            return
        await send(message)

    return send_with_trailers


#: Where ``LimitedHttpTools`` (imported by name, as uvicorn's worker processes import their
#: protocol) reads its limits: set by ``servescope serve --workers`` for its workers.
ENV_HEADER_BYTES, ENV_HEADER_TIMEOUT = "SERVESCOPE_MAX_HEADER_BYTES", "SERVESCOPE_HEADER_TIMEOUT_S"


def __getattr__(name: str) -> Any:
    if name == "LimitedHttpTools":  # "servescope.serve.limits:LimitedHttpTools", for uvicorn's workers
        import os

        limits = HttpLimits(
            max_header_bytes=int(os.environ.get(ENV_HEADER_BYTES, 64 * 1024)),
            header_timeout_s=float(os.environ.get(ENV_HEADER_TIMEOUT, 10.0)),
        )
        return limited_httptools(limits)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
