"""What the load generator sends and keeps, as plain data: the endpoint's ``URL``, the raw
requests (``build_requests``), an open loop's send times (``schedule``) and one ``Result`` per
request, with what reads a Result (``error_kind``, ``streamed``, ``usage``).

    target = URL.parse("http://127.0.0.1:8000/predict")
    raw = build_requests(target, method="POST", bodies=[b'{"text": "hi"}'])

``loadgen.py`` drives them (and re-exports them); the report's figures, the request log and a
Ray generator's merged results read them without the generator.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ..exceptions import ConfigError

__all__ = [
    "CHUNKED", "MAX_SERVER_TIMING_BYTES", "OUTPUT", "OVERSIZED", "SSE", "Result", "URL",
    "build_requests", "error_kind", "ok_latencies_ms", "schedule", "streamed", "usage",
]  # fmt: skip

#: The most ``Server-Timing`` text kept per response (its lines joined): 8 KiB, a server's usual
#: limit for one header line. servescope's own header is a few hundred bytes; past the cap a
#: response keeps ``OVERSIZED`` instead (a hostile server could send megabytes per response,
#: kept for the whole run and parsed after it).
MAX_SERVER_TIMING_BYTES = 8192
#: What a response keeps in place of a Server-Timing value over the cap: a NUL, which no header
#: value may hold, so it survives pickling (results from Ray generators) and compares by value.
OVERSIZED = b"\0"
#: ``Result.stream[0]``: a chunked response (each chunk counts), or Server-Sent Events (each
#: event with a ``data`` field counts, wherever the chunks split it)
CHUNKED = 1
SSE = 2


class Result(NamedTuple):
    """One completed (or failed) request, as the generator saw it (``perf_counter_ns`` times).

    A named tuple: as cheap to build and to pickle (results from Ray generators) as the bare
    tuple it replaces, so the generator's own cost per request does not move.

        r = results[0]
        r.done_ns - r.sent_ns, r.status, error_kind(r)
    """

    #: when the request was due: the open loop's schedule; the send time in closed loop
    scheduled_ns: int
    #: when its bytes were written
    sent_ns: int
    #: when the response completed, or the request failed
    done_ns: int
    #: the HTTP status, or 0 when no response came
    status: int
    #: the raw ``Server-Timing`` value (several lines joined), ``OVERSIZED``, or None
    server_timing: bytes | None
    #: a transport failure ("timeout", "connection reset", "not sent" ...), or None
    error: str | None
    #: a streamed response: ``(CHUNKED or SSE, head_ns, [arrival_ns of each chunk or event])``
    #: (the head: status line and headers); None for a plain response
    stream: tuple[int, int, list[int]] | None = None
    #: which of the generator's ``requests`` it was (its index), or -1 when not known
    request: int = -1
    #: OpenAI-compatible runs: ``(completion_tokens, prompt_tokens or None)`` from the answer's
    #: ``usage``, or None when it sent none
    usage: tuple[int, int | None] | None = None
    #: when the response's first byte arrived (time to first byte: ``first_ns - sent_ns``), or 0
    #: when none did
    first_ns: int = 0


#: OpenAI-compatible runs: an event that carries text, a non-empty ``content``,
#: ``reasoning_content`` or ``text`` string (a key inside a string is escaped, ``\"text\"``,
#: so it does not match); and a ``usage`` object (not ``"usage": null``, which OpenAI sends in
#: every event but the last)
OUTPUT = re.compile(rb'"(?:content|reasoning_content|text)"\s*:\s*"(?!")')
USAGE = re.compile(rb'"usage"\s*:\s*\{')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def usage(data: bytes | None) -> tuple[int, int | None] | None:
    """``(completion_tokens, prompt_tokens or None)`` from the ``usage`` object in ``data`` (an
    event, or the end of a whole answer), or None when there is none."""
    if not data:
        return None
    m = USAGE.search(data)
    if m is None:
        return None
    rest = data[m.end() : m.end() + 4096]
    out = _COMPLETION.search(rest)
    if out is None:
        return None
    prompt = _PROMPT.search(rest)
    return int(out.group(1)), None if prompt is None else int(prompt.group(1))


def error_kind(result: Result) -> str | None:
    """Why a request failed (a transport error, or ``HTTP <status>`` for >= 400), or None."""
    if result.error is not None:
        return result.error
    if result.status >= 400:
        return f"HTTP {result.status}"
    return None


def streamed(result: Result) -> bool:
    """Whether the response was streamed: Server-Sent Events, or chunked in two chunks or more
    (a chunked answer in one chunk is a plain one: raw ASGI apps chunk every answer)."""
    s = result.stream
    return s is not None and (s[0] == SSE or len(s[2]) > 1)


def ok_latencies_ms(results: list[Result]) -> list[float]:
    """The successes' latencies (ms, from the earlier of schedule and send), for live views."""
    return [
        (r.done_ns - min(r.scheduled_ns, r.sent_ns)) / 1e6 for r in results if r.error is None and r.status < 400
    ]


@dataclass(frozen=True)
class URL:
    """Where the load goes: an endpoint's URL, parsed (``URL.parse("http://127.0.0.1:8000/predict")``)."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> URL:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"malformed URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"malformed URL {url!r}: expected http://HOST[:PORT]/PATH or https://...")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"


def build_requests(
    target: URL,
    *,
    method: str = "GET",
    bodies: list[bytes] | None = None,
    headers: list[tuple[str, str]] | None = None,
    content_type: str | None = None,
) -> list[bytes]:
    """The raw requests to send, one per body (cycled by the generator)."""
    head = [f"{method} {target.path} HTTP/1.1", f"Host: {target.host_header}", "User-Agent: servescope"]
    names = {k.lower() for k, _ in headers or []}
    if content_type and "content-type" not in names:
        head.append(f"Content-Type: {content_type}")
    for k, v in headers or []:
        if "\r" in k + v or "\n" in k + v:
            raise ConfigError(f"header {k!r} contains a line break")
        head.append(f"{k}: {v}")
    out = []
    for body in bodies or [b""]:
        lines = [*head]
        if body or method not in ("GET", "HEAD"):
            lines.append(f"Content-Length: {len(body)}")
        out.append(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    return out


def schedule(rate: float, start_ns: int, *, poisson: bool = False, seed: int | None = None):
    """Send times (ns) for an open loop at ``rate`` requests/s: evenly spaced, or Poisson."""
    if not rate > 0:
        raise ConfigError(f"rate must be > 0 requests/s, got {rate!r}")
    k = 0
    if not poisson:
        while True:
            yield start_ns + round(k * 1e9 / rate)
            k += 1
    rng = random.Random(seed)
    t = float(start_ns)
    while True:
        yield round(t)
        t += rng.expovariate(rate) * 1e9


async def _tcp(loop: asyncio.AbstractEventLoop, addresses: list[Any]) -> socket.socket:
    """A connected socket to the first of ``addresses`` (getaddrinfo's) that accepts."""
    error: OSError = OSError("no address to connect to")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        if family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as create_connection does
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


def _connect_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncio.TimeoutError):
        return "connect timeout"
    return f"connect error ({type(exc).__name__})"
