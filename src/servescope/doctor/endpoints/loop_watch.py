"""The event loop's lag, as the doctor measures it while it observes: how late the loop wakes a
task that sleeps a few ms (the time something held the loop)."""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["LoopWatch"]


class LoopWatch:
    """How late an event loop wakes a task that sleeps ``interval``: the time the loop was
    blocked (``lag_ms``). Only while the doctor observes (``watching``): each tick takes the
    GIL from whatever thread holds it, and a `def` route's pure-Python work on a worker thread
    (joblib's unpickler) ran 5.5 ms slower in a 22-ms request beside a 5-ms tick, paired under
    uvicorn (docs/benchmarks.md, session 27); the phases that time the endpoint as it runs
    (without the probes and the sampler) are without it too. Paused, it awaits its resumption
    and wakes nothing. Its state changes on the loop's own thread, so no tick races a pause."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.lag_ms: list[float] = []
        self.ticks = 0  # (its wake-ups: none while paused)
        self.on = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resumed: asyncio.Event | None = None

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            if not self.on:
                self._resumed = asyncio.Event()
                await self._resumed.wait()
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.ticks += 1
            if self.on:
                self.lag_ms.append(max(0.0, (time.perf_counter() - t0 - self.interval) * 1000))

    def watching(self, on: bool) -> None:
        """Tick (``on``) or stop ticking, from any thread."""
        if self._loop is None:
            self.on = on  # (not started yet: it starts in this state)
        loop = self._loop  # (read again: it may have started meanwhile)
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # (a loop closed since: nothing ticks)
                loop.call_soon_threadsafe(self._set, on)

    def _set(self, on: bool) -> None:
        self.on = on
        if on and self._resumed is not None:
            self._resumed.set()
