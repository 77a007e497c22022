"""Clocks: how a stage boundary is marked, and how marks become nanoseconds.

``WallClock`` (host time), ``SyncClock`` (host time after a device sync at each boundary) and
``CudaEventClock`` (CUDA events, resolved once at the end of the request); ``resolve_clock``
picks one for a trace's ``cuda`` mode.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Protocol

from .exceptions import ConfigError

log = logging.getLogger("servescope")

__all__ = ["Clock", "CudaEventClock", "SyncClock", "WallClock", "resolve_clock", "total_ns"]


class Clock(Protocol):
    """Marks stage boundaries; turns marks into nanoseconds since the trace's first mark.

    A clock may also define ``total_ns(start, end)``, the request's whole time between its
    first and last marks; without it, that is ``resolve(start, [end])[0]``.
    """

    name: str

    def mark(self) -> Any: ...

    def resolve(self, start: Any, marks: list[Any]) -> list[int]: ...


def total_ns(clock: Clock, start: Any, end: Any) -> int:
    """The request's time between its first and last marks, on the clock's terms."""
    total = getattr(clock, "total_ns", None)
    return total(start, end) if total is not None else clock.resolve(start, [end])[0]


class WallClock:
    """Host time (``time.perf_counter_ns``). Right for CPU work; blind to queued CUDA kernels.

    Pass another ``now`` (a callable returning integer nanoseconds) to drive it by hand in tests.
    """

    name = "wall"

    def __init__(self, now: Callable[[], int] = time.perf_counter_ns) -> None:
        self.mark = now

    def resolve(self, start: int, marks: list[int]) -> list[int]:
        return [m - start for m in marks]

    def __repr__(self) -> str:
        return "WallClock()"


class SyncClock(WallClock):
    """Host time taken after a device synchronisation at every boundary.

    Right on a GPU, but each boundary stalls the host until all queued work is done, so the
    pipeline loses its overlap: use it to check, not in production.
    """

    name = "sync"

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        now: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if synchronize is None:
            import torch

            synchronize = torch.cuda.synchronize
        self._synchronize = synchronize
        self._now = now

        def mark() -> int:
            self._synchronize()
            return self._now()

        self.mark = mark

    def __repr__(self) -> str:
        return "SyncClock()"


class CudaEventClock:
    """CUDA events recorded on the current stream at each boundary, resolved once at the end.

    Each stage is charged with the stream's progress between its boundaries, so kernel time
    lands in the stage that launched it, and the request is never stalled mid-way.
    ``event`` is a factory of objects with ``record()``, ``synchronize()`` and
    ``elapsed_time(other) -> ms`` (``torch.cuda.Event`` by default; a fake in tests).

    A mark is the event and the host time it was recorded at (``now``, ``perf_counter_ns`` by
    default): the request's total is its host time, or the device's span when the device
    finished later. When the stream is busy with other work as the request starts (another
    request's kernels), the events only start counting once the stream reaches them; the
    host time keeps that wait in the total (as ``other``) instead of hiding it.
    """

    name = "events"
    #: reads of events that failed in this process (each fell back to host clocks)
    failures = 0

    def __init__(self, event: Callable[..., Any] | None = None, now: Callable[[], int] = time.perf_counter_ns) -> None:
        if event is None:
            import torch

            event = torch.cuda.Event
        self._event = event
        self._now = now

    def mark(self) -> tuple[Any, int]:
        ev = self._event(enable_timing=True)
        ev.record()
        return ev, self._now()

    def resolve(self, start: tuple[Any, int], marks: list[tuple[Any, int]]) -> list[int]:
        first = start[0]
        try:
            out = []
            for ev, _ in marks:
                ev.synchronize()  # a no-op for all but the latest: the stream runs in order
                out.append(round(first.elapsed_time(ev) * 1e6))
            return out
        except Exception as exc:  # noqa: BLE001 - the user's request must not fail on our timing
            # events on two devices cannot be compared; a failed kernel makes CUDA calls raise
            CudaEventClock.failures += 1
            if CudaEventClock.failures == 1:
                log.warning(
                    "servescope: CUDA events could not be read (%s: %s); such requests are timed "
                    "on host clocks instead", type(exc).__name__, exc,
                )  # fmt: skip
            return [host - start[1] for _, host in marks]

    def total_ns(self, start: tuple[Any, int], end: tuple[Any, int]) -> int:
        return max(end[1] - start[1], self.resolve(start, [end])[0])

    def __repr__(self) -> str:
        return "CudaEventClock()"


_WALL = WallClock()


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:  # never imported: CUDA cannot be in use, and we do not import it
        return False
    if getattr(sys.modules.get("torch.cuda"), "_initialized", None) is False:
        return False  # torch's own flag: the CPU case without a call (True still asks, for forks)
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a half-imported or stub torch must not break the user's request
        return False


def resolve_clock(cuda: str, clock: Clock | None) -> Clock:
    """The clock a trace uses for the given ``cuda`` mode."""
    if clock is not None:
        return clock
    if cuda == "wall":
        return _WALL
    if cuda == "auto":
        return CudaEventClock() if _cuda_initialized() else _WALL
    if cuda == "events":
        return CudaEventClock()
    if cuda == "sync":
        return SyncClock()
    raise ConfigError(f"cuda must be 'auto', 'events', 'sync' or 'wall', not {cuda!r}")
