from __future__ import annotations

import pytest


class ManualClock:
    """A host clock driven by hand: ``advance(ms)`` moves it; ``now()`` reads it in ns."""

    def __init__(self) -> None:
        self.ns = 0

    def now(self) -> int:
        return self.ns

    def advance(self, ms: float) -> None:
        self.ns += round(ms * 1e6)


class FakeGPU:
    """A one-stream GPU: kernels queue and run in order; the host only waits when it syncs.

    Times are integers in ns on one timeline shared by host and device.
    """

    LAUNCH_NS = 10_000  # the host's cost to queue a kernel

    def __init__(self) -> None:
        self.host = 0
        self.stream_done = 0  # when the last queued work finishes
        self.syncs = 0

    def now(self) -> int:
        return self.host

    def cpu(self, ms: float) -> None:
        self.host += round(ms * 1e6)

    def launch(self, ms: float) -> None:
        start = max(self.host, self.stream_done)
        self.stream_done = start + round(ms * 1e6)
        self.host += self.LAUNCH_NS

    def synchronize(self) -> None:
        self.syncs += 1
        self.host = max(self.host, self.stream_done)

    def event(self, enable_timing: bool = False) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.t: int | None = None

    def record(self) -> None:
        # the event completes when the stream reaches it
        self.t = max(self.gpu.host, self.gpu.stream_done)
        self.gpu.stream_done = self.t

    def synchronize(self) -> None:
        self.gpu.syncs += 1
        self.gpu.host = max(self.gpu.host, self.t)

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.t - self.t) / 1e6


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gpu() -> FakeGPU:
    return FakeGPU()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
