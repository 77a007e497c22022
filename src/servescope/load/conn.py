"""One keep-alive connection of the load generator (``loadgen.LoadGenerator``): a plain
asyncio protocol that writes a request's pre-encoded bytes and reads its answer with httptools
(llhttp, in C), keeping the raw ``Server-Timing``, a stream's arrival times, an OpenAI answer's
``usage`` and (for conversations) its text, with as little work per response as it can.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httptools

# in this module's globals, where the per-response path looks them up
from .wire import CHUNKED, OUTPUT, OVERSIZED, SSE, USAGE, Result, usage

if TYPE_CHECKING:
    from .loadgen import LoadGenerator

__all__ = ["ERROR_BODY_BYTES", "OPENAI_TAIL_BYTES"]

#: How much of the first error answer's body is kept.
ERROR_BODY_BYTES = 512
#: OpenAI-compatible runs: how much of a plain answer's end is kept to find its ``usage``, and
#: the longest SSE line kept whole (a longer one is cut: its event then counts by what is kept)
OPENAI_TAIL_BYTES = 65536

#: Builds a Result without the generated ``__new__``'s Python frame (a third of the cost),
#: on the per-response path only.
_result = tuple.__new__


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one request in flight (no pipelining)."""

    def __init__(self, gen: LoadGenerator) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.cur: list[Any] | None = None  # [scheduled_ns, sent_ns]
        self.st: bytes | None = None  # the first Server-Timing line, or OVERSIZED
        self.more: list[bytes] | None = None  # with several lines: all of them, joined at the end
        self.st_len = 0  # their joined length, while several
        self.st_cap = gen.max_server_timing_bytes
        self.body: bytes | None = None  # kept only for the run's first error answer
        self.kind = 0  # CHUNKED or SSE once the headers say so
        self.head_ns = 0
        self.chunks: list[int] | None = None  # a streamed response's arrival times
        self.new_chunk = False
        self.sse_rest = b""  # the start of an SSE line not yet ended (6 bytes say what it is)
        self.sse_data = False  # the SSE event under way has a data field
        self.open = False
        self.index = -1  # the request in flight: its index in gen.requests
        self.openai = gen.openai
        self.usage: bytes | None = None  # OpenAI: the event with the usage object
        self.tail: bytes | None = None  # OpenAI: the end of an answer that is not SSE (its usage is there)
        self.first_ns = 0  # the response's first byte
        #: sessions (``keep_answers``): the answer's SSE data lines, or its body's pieces; what
        #: the last response carried, once it completed
        self.answer: list[bytes] | None = [] if gen.keep_answers else None
        self.last_answer: list[bytes] = []
        self.waiter: asyncio.Future[Result] | None = None  # sessions: who waits for the response

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        if not self.first_ns:
            self.first_ns = time.perf_counter_ns()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._drop("bad response")

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.cur is not None:
            self._drop("connection reset" if self.gen.running or self.gen._draining else "unfinished at the end")

    # httptools callbacks
    def on_headers_complete(self) -> None:
        # the run's first error answer keeps its body (up to ERROR_BODY_BYTES), to say why
        if self.gen.first_error_body is None and self.parser.get_status_code() >= 400:
            self.body = b""
        if self.kind:
            self.head_ns = time.perf_counter_ns()
            self.chunks = []
        if self.openai and self.kind != SSE:  # an answer in one piece: its usage is near its end
            self.tail = b""

    def on_chunk_header(self) -> None:
        self.new_chunk = True

    def on_body(self, body: bytes) -> None:
        if self.chunks is not None:
            if self.kind == SSE:
                self._events(body)
            elif self.new_chunk:  # a chunk's bytes may come in several reads: its first read counts
                self.new_chunk = False
                self.chunks.append(time.perf_counter_ns())
        if self.tail is not None:
            self.tail = (self.tail + body)[-OPENAI_TAIL_BYTES:]
            if self.answer is not None:
                self.answer.append(body)
        if self.body is not None and len(self.body) < ERROR_BODY_BYTES:
            self.body += body[: ERROR_BODY_BYTES - len(self.body)]

    def _events(self, body: bytes) -> None:
        """Server-Sent Events: an event ends at an empty line; it counts when it had a data
        field (lines end in LF or CRLF)."""
        if self.sse_rest:
            body = self.sse_rest + body
        lines = body.split(b"\n")
        if self.openai:
            self.sse_rest = lines.pop()[:OPENAI_TAIL_BYTES]
            self._openai_events(lines)
            return
        self.sse_rest = lines.pop()[:13]  # enough of a split line to tell "data:" (and "data: [DONE]")
        now = 0
        for line in lines:
            if not line or line == b"\r":
                if self.sse_data:
                    self.sse_data = False
                    self.chunks.append(now or (now := time.perf_counter_ns()))  # type: ignore[union-attr]
            elif line[:5] == b"data:" or line.rstrip(b"\r") == b"data":
                if line[5:].strip() != b"[DONE]":  # OpenAI's end-of-stream marker: not a token
                    self.sse_data = True

    def _openai_events(self, lines: list[bytes]) -> None:
        """OpenAI's events: a token when it carries text; the one with ``usage`` is kept."""
        now = 0
        for line in lines:
            if not line or line == b"\r":
                if self.sse_data:
                    self.sse_data = False
                    self.chunks.append(now or (now := time.perf_counter_ns()))  # type: ignore[union-attr]
            elif line[:5] == b"data:":
                if OUTPUT.search(line):
                    self.sse_data = True
                    if self.answer is not None:
                        self.answer.append(line)
                if USAGE.search(line):
                    self.usage = line

    def on_header(self, name: bytes, value: bytes) -> None:
        n = len(name)
        if n == 13:
            if name.lower() == b"server-timing":
                if self.chunks is not None:  # a trailer, after a chunked body: the head's figures are the ones
                    return  # read (its whole-stream breakdown would count the stream after the head twice)
                if self.st is None and len(value) <= self.st_cap:
                    self.st = value
                else:
                    self._another_timing_line(value)
        elif n == 12:
            if value[:17].lower() == b"text/event-stream" and name.lower() == b"content-type":
                self.kind = SSE
        elif n == 17 and not self.kind and name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            self.kind = CHUNKED

    def _another_timing_line(self, value: bytes) -> None:
        st = self.st
        if st is None:  # a first line over the cap: nothing of it is kept
            self.st = OVERSIZED
        elif st is not OVERSIZED:
            if self.more is None:
                self.more, self.st_len = [st], len(st)
            self.st_len += 2 + len(value)
            if self.st_len > self.st_cap:
                self.st, self.more = OVERSIZED, None
            else:
                self.more.append(value)

    def on_message_complete(self) -> None:
        done = time.perf_counter_ns()
        cur, self.cur = self.cur, None
        st, self.st = self.st, None
        if self.more is not None:  # joined once, not at each line
            st, self.more = b", ".join(self.more), None
        stream = None
        if self.chunks is not None:
            # a chunked answer in one chunk is a plain one (raw ASGI apps chunk every answer):
            # nothing kept, so the run holds no extra object per plain response
            if self.kind == SSE or len(self.chunks) > 1:
                stream = (self.kind, self.head_ns, self.chunks)
            self.chunks, self.kind, self.sse_rest, self.sse_data = None, 0, b"", False
        tokens = None
        if self.openai:
            tokens, self.usage, self.tail = usage(self.usage or self.tail), None, None
            if self.answer is not None:
                self.last_answer, self.answer = self.answer, []
        if cur is None:  # a response nobody asked for (after a timeout): ignore it
            return
        gen = self.gen
        parser = self.parser
        if self.body is not None:
            if gen.first_error_body is None:
                gen.first_error_body = f"HTTP {parser.get_status_code()}: " + self.body.decode("utf-8", "replace")
            self.body = None
        first, self.first_ns = self.first_ns, 0
        result = _result(Result, (cur[0], cur[1], done, parser.get_status_code(), st, None, stream, self.index, tokens, first))
        if not parser.should_keep_alive():
            self.open = False
            self.transport.close()  # type: ignore[union-attr]
        elif gen._fast:  # closed loop in full swing: send the next request right here
            gen.results.append(result)
            reqs = gen.requests
            gen.sent += 1
            now = time.perf_counter_ns()
            self.cur = [now, now]
            self.index = i = gen._next % len(reqs)  # in order: the next of the list, whoever sends
            gen._next += 1
            self.transport.write(reqs[i])  # type: ignore[union-attr]
            if gen._limit is not None and gen.sent >= gen._limit:
                gen._fast = False
            return
        gen._complete(self, result)

    def send(self, request: bytes, cur: list[Any], index: int = -1) -> None:
        self.cur = cur
        self.index = index
        self.first_ns = 0
        cur[1] = now = time.perf_counter_ns()
        if cur[0] is None:  # closed loop: scheduled when sent
            cur[0] = now
        self.transport.write(request)  # type: ignore[union-attr]

    def _drop(self, kind: str) -> None:
        cur, self.cur = self.cur, None
        self.st = self.more = self.body = self.chunks = self.usage = self.tail = None
        if self.answer is not None:
            self.answer = []
        self.kind, self.sse_rest, self.sse_data = 0, b"", False
        self.open = False
        first, self.first_ns = self.first_ns, 0
        if self.transport is not None:
            self.transport.close()
        if cur is not None:
            self.gen._complete(self, Result(cur[0], cur[1], time.perf_counter_ns(), 0, None, kind, None, self.index, None, first))
