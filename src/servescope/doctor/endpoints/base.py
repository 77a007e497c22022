"""What every endpoint gives the doctor: start, one request, a concurrent phase, stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...timing import Trace

if TYPE_CHECKING:
    from .loop_watch import LoopWatch

__all__ = ["UNFINISHED", "Observation", "Endpoint", "untraced_load"]

#: The error of a request still running when its phase's time ran out: not counted as a failure.
UNFINISHED = "unfinished at the end"


@dataclass
class Observation:
    """One request as the doctor saw it: the client's latency and error, the server-side
    trace and the probes' evidence for it (when the request was seen inside the process)."""

    latency_ms: float
    status: int | None = None
    error: str | None = None
    trace: Trace | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    #: what the endpoint answered (a handler's return value, an app's response body), kept so
    #: that an experiment can check a fix changes no answer; None once it is not needed
    answer: Any = None
    #: a streamed answer (chunked, Server-Sent Events, a handler that returns a generator):
    #: when its first chunk came, ms after the request was sent; None for a plain answer
    first_chunk_ms: float | None = None
    #: the gaps between its consecutive chunks (ms), as its reader waits for them
    chunk_gaps_ms: list[float] = field(default_factory=list)


class Endpoint(Protocol):
    """An endpoint the doctor can drive: a function, an ASGI app or a WSGI app."""

    kind: str
    #: how late the event loop woke a sleeping task (``loop_watch.lag_ms``, ms), for endpoints
    #: with a loop: recorded only while the doctor observes (``watching``)
    loop_watch: LoopWatch

    @property
    def loop_thread_id(self) -> int | None:
        """The thread running the endpoint's event loop, or None when it has none."""

    def start(self, timeout_s: float) -> None:
        """Be ready to take requests within ``timeout_s`` (raise ``EndpointError`` if not)."""

    def request(self, body: bytes, timeout_s: float, path: str | None = None) -> Observation:
        """One request with ``body`` (a function gets the JSON parsed, afresh each call; an app
        gets it with the endpoint's method and Content-Type, at ``path`` when given: another
        query string); a handler that does not answer within ``timeout_s`` is abandoned."""

    def one_by_one(self, body: bytes, n: int, timeout_s: float, max_seconds: float, path: str | None = None) -> list[Observation]:
        """Up to ``n`` requests as ``request`` sends them, one after another: none starts once
        ``max_seconds`` have passed (the first always does), nor after one that timed out. An
        app's come from the helper process once ``ready_load`` started it, all in one go."""

    def concurrent(
        self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Observation], float]:
        """``requests`` requests from ``concurrency`` callers, within ``max_seconds``; those
        still running then are marked ``UNFINISHED``."""

    def ready_load(self) -> None:
        """Start what the concurrent load needs before a phase's clock starts (an app's helper
        process, which sends the requests one at a time too from then on); nothing for a
        function, whose callers are threads of this process."""

    def concurrent_from_outside(
        self, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Observation], float] | None:
        """The load of ``concurrent`` sent from another process (latencies and errors, no
        traces), or None where it cannot be: a function, or an app whose helper could not run."""

    #: where the last concurrent phase's load came from, said in the evidence ("" before one)
    load_from: str

    def routes(self) -> list[tuple[str, list[str]]]:
        """The app's routes and their methods (empty for a function)."""

    def stop(self) -> None:
        """Stop serving; never waits long for a handler that will not return."""


def untraced_load(
    endpoint: Endpoint, body: bytes, concurrency: int, requests: int, timeout_s: float, max_seconds: float
) -> tuple[list[Observation], float]:
    """A concurrent load whose latencies are all that is wanted (an experiment's block, the
    unprobed run): from the helper process where the endpoint has one, else its own callers."""
    got = endpoint.concurrent_from_outside(body, concurrency, requests, timeout_s, max_seconds)
    return got if got is not None else endpoint.concurrent(body, concurrency, requests, timeout_s, max_seconds)
