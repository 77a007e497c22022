"""One request as the doctor's client sends it: from the helper process, where an app's
clients are (endpoints/outside.py), or from the doctor's own where no helper can run.

    sent = send_one("127.0.0.1", 8000, "POST", "/predict", b'{"text": "hi"}', {"Content-Type": "application/json"}, 30.0)
    sent.latency_ms, sent.status, sent.error, sent.data, sent.first_chunk_ms, sent.gaps_ms
    sents = send_in_turn("127.0.0.1", 8000, "POST", "/predict", body, [headers] * 5, timeout_s=30.0, max_seconds=8.0)
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from typing import Callable, NamedTuple, TypeVar

_R = TypeVar("_R")

__all__ = ["Sent", "in_turn", "send_in_turn", "send_one"]


class Sent(NamedTuple):
    """One request's answer as its client saw it."""

    latency_ms: float
    status: int | None
    error: str | None
    data: bytes | None
    #: a streamed answer: when its first chunk came (ms after the request was sent); else None
    first_chunk_ms: float | None
    #: the gaps between a streamed answer's consecutive chunks (ms)
    gaps_ms: list[float]


def send_one(host: str, port: int, method: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Sent:
    """Send one request on a new connection and read its whole answer (a streamed one as it
    comes), within ``timeout_s``; the endpoint's failure is the result's ``error``."""
    t0 = time.perf_counter_ns()
    status, err, data, first = None, None, None, None
    arrivals: list[int] = []
    deadline = time.monotonic() + timeout_s
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        assert conn.sock is not None
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        resp = conn.getresponse()
        status = resp.status
        if _streamed(resp):  # read it as it comes: when did its first chunk arrive?
            chunks = []
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                arrivals.append(time.perf_counter_ns())
                if first is None:
                    first = (arrivals[0] - t0) / 1e6
                chunks.append(chunk)
            data = b"".join(chunks)
        else:
            data = resp.read()
        if status >= 400:
            err = f"HTTP {status}: {one_line(data)}"
    except socket.timeout:
        err = f"timeout: no answer within {timeout_s:.3g} s"
    except (OSError, http.client.HTTPException) as exc:
        err = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    latency = (time.perf_counter_ns() - t0) / 1e6
    return Sent(latency, status, err, data, first, [(b - a) / 1e6 for a, b in zip(arrivals, arrivals[1:])])


def send_in_turn(
    host: str, port: int, method: str, path: str, body: bytes, headers: list[dict[str, str]], timeout_s: float, max_seconds: float
) -> list[Sent]:
    """A request for each of ``headers``, one after another: none starts once ``max_seconds``
    have passed (the first always does), nor after one that timed out."""
    return in_turn([lambda h=h: send_one(host, port, method, path, body, h, timeout_s) for h in headers], max_seconds)


def in_turn(calls: list[Callable[[], _R]], max_seconds: float) -> list[_R]:
    """Each call's result, one after another: none starts once ``max_seconds`` have passed
    (the first always does), nor after one whose ``error`` says it timed out."""
    out: list[_R] = []
    deadline = time.perf_counter() + max_seconds
    for call in calls:
        if out and (time.perf_counter() > deadline or (getattr(out[-1], "error", None) or "").startswith("timeout")):
            break
        out.append(call())
    return out


def _streamed(resp: http.client.HTTPResponse) -> bool:
    """An answer sent in chunks (``Transfer-Encoding: chunked``, Server-Sent Events) rather than
    with its length: what a streamed response looks like on the wire."""
    return resp.getheader("Content-Length") is None and (
        "chunked" in (resp.getheader("Transfer-Encoding") or "").lower() or "event-stream" in (resp.getheader("Content-Type") or "")
    )


def one_line(body: bytes, limit: int = 160) -> str:
    """An error answer's body as one short line: an HTML page's text without its tags."""
    text = body[:4096].decode("utf-8", "replace")
    if text.lstrip()[:1] == "<":
        text = re.sub(r"<title>.*?</title>", " ", text, flags=re.S | re.I)
        text = re.sub(r"<[^>]*>", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
