"""The doctor's loop watch ticks only while the doctor observes: its 5-ms wake-ups take the GIL
from the endpoint's worker threads, which the phases that time the endpoint as it runs (the
experiments, the requests without the probes) must not pay."""

from __future__ import annotations

import asyncio
import threading
import time

from servescope.doctor.endpoints.loop_watch import LoopWatch


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


def test_a_paused_watch_wakes_nothing_and_a_watching_one_sees_the_loop_blocked(wait_until):
    watch = LoopWatch(interval=0.005)
    loop = _Loop()
    try:
        loop.start(watch)
        wait_until(lambda: watch._loop is not None)
        loop.settle()
        time.sleep(0.2)  # (ticking, it would wake about 40 times meanwhile)
        assert watch.ticks == 0 and watch.lag_ms == []  # starts paused: not one tick
        watch.watching(True)
        wait_until(lambda: watch.ticks >= 2)
        loop.block(0.08)
        wait_until(lambda: bool(watch.lag_ms) and max(watch.lag_ms) >= 40)  # the 80 ms the loop was held
        watch.watching(False)
        loop.settle()
        before, seen = watch.ticks, len(watch.lag_ms)
        time.sleep(0.2)
        loop.block(0.08)
        loop.settle()
        # paused again: it wakes nothing (but for a sleep already under way) and records nothing
        assert watch.ticks <= before + 1 and len(watch.lag_ms) == seen
        watch.watching(True)
        wait_until(lambda: watch.ticks > before + 2)  # and it resumes
    finally:
        loop.close()


def test_the_state_set_before_the_loop_runs_it_is_the_one_it_starts_in(wait_until):
    watch = LoopWatch(interval=0.005)
    watch.watching(True)
    loop = _Loop()
    try:
        loop.start(watch)
        wait_until(lambda: watch.ticks >= 1)
        loop.block(0.06)
        wait_until(lambda: bool(watch.lag_ms) and max(watch.lag_ms) >= 30)
    finally:
        loop.close()


def test_the_doctor_watches_the_loop_only_while_it_observes(tmp_path, monkeypatch):
    """On in the sequential and concurrent phases (beside the sampler: they time the stages and
    the loop's stalls); off wherever the endpoint is timed as it runs: the fixes' blocks and the
    requests without the probes."""
    import joblib

    from servescope.doctor import DoctorOptions, diagnose
    from servescope.doctor.endpoints import loop_watch

    path = tmp_path / "model.joblib"
    joblib.dump({"weights": list(range(2000))}, path)
    watches: list[LoopWatch] = []
    made = loop_watch.LoopWatch.__init__
    monkeypatch.setattr(loop_watch.LoopWatch, "__init__", lambda self, *a, **k: (made(self, *a, **k), watches.append(self))[0])
    phase, seen = ["start"], []

    async def predict(payload):  # (on the loop: what it sees of the watch is what the watch does)
        model = joblib.load(path)  # a load per request: its fix is tried at one client
        seen.append((phase[0], watches[0].on))
        return {"n": len(model["weights"])}

    options = DoctorOptions(requests=6, concurrency=2, concurrent_requests=6, timeout_s=5.0, experiment_seconds=4.0)
    rep = diagnose(predict, payload={}, options=options, progress=lambda p, _: phase.__setitem__(0, p))
    assert rep.diagnosis.evidence["experiments"]["memoise-loaders"]["tried"]
    observed = {"sequential requests", "concurrent requests"}
    assert all(on for p, on in seen if p in observed) and {p for p, _ in seen} >= observed
    timed = [(p, on) for p, on in seen if p not in observed | {"cold request"}]
    assert {p for p, _ in timed} >= {"requests without the probes"} and len(timed) >= 10  # (the fixes' blocks among them)
    assert not any(on for _, on in timed), sorted({p for p, on in timed if on})
