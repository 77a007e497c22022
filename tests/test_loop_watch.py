"""The doctor's loop watch ticks only while the doctor observes: its 5-ms wake-ups take the GIL
from the endpoint's worker threads, which the phases that time the endpoint as it runs (the
experiments, the requests without the probes) must not pay."""

from __future__ import annotations

import asyncio
import threading
import time

from servescope.doctor.endpoints.function import LoopWatch


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def block(self, seconds: float) -> None:
        """Hold the loop's thread for ``seconds``, and wait until it has."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (time.sleep(seconds), done.set()))
        assert done.wait(10)

    def settle(self) -> None:
        """Wait until the loop has run what was handed to it before."""
        self.block(0.0)
        time.sleep(0.05)

    def start(self, watch: LoopWatch) -> None:
        self.task = asyncio.run_coroutine_threadsafe(watch.run(), self.loop)

    def close(self) -> None:
        self.task.cancel()
        self.settle()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_a_paused_watch_wakes_nothing_and_a_watching_one_sees_the_loop_blocked():
    watch = LoopWatch(interval=0.005)
    loop = _Loop()
    try:
        loop.start(watch)
        time.sleep(0.2)
        assert watch.ticks == 0 and watch.lag_ms == []  # starts paused: not one tick
        watch.watching(True)
        time.sleep(0.1)
        loop.block(0.08)
        loop.settle()
        assert watch.ticks >= 5 and max(watch.lag_ms) >= 40  # (5-ms ticks, 80 ms blocked: generous bounds)
        watch.watching(False)
        loop.settle()
        before, seen = watch.ticks, len(watch.lag_ms)
        time.sleep(0.2)
        loop.block(0.08)
        assert watch.ticks == before and len(watch.lag_ms) == seen  # paused again: it wakes nothing, and records nothing
        watch.watching(True)
        loop.settle()
        time.sleep(0.05)
        assert watch.ticks > before  # and it resumes
    finally:
        loop.close()


def test_the_state_set_before_the_loop_runs_it_is_the_one_it_starts_in():
    watch = LoopWatch(interval=0.005)
    watch.watching(True)
    loop = _Loop()
    try:
        loop.start(watch)
        time.sleep(0.05)
        loop.block(0.06)
        loop.settle()
        assert watch.lag_ms and max(watch.lag_ms) >= 30
    finally:
        loop.close()
