from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

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


def _wait_until(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    """Wait for ``condition()``, failing after ``timeout_s``: generous, as a busy machine may
    schedule the thread that makes it true late; never a fixed sleep."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.001)


@pytest.fixture
def wait_until() -> Callable[..., None]:
    return _wait_until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Twin:
    """One implementation of the hot path, with servescope's ``Stage`` and ``Trace`` over it."""

    name: str  # "c" or "python"
    module: ModuleType  # servescope._speedups or servescope._speedups_py
    Stage: type
    Trace: type
    stage: Callable[[str], Any]
    shared: dict[str, Any]  # its stages shared per name

    @property
    def trace(self) -> type:
        return self.Trace


@pytest.fixture(params=["c", "python"])
def speedups(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Twin:
    """The hot path's twins, one per run of the test that takes it, in this process: the C
    extension (servescope._speedups) and its pure-Python twin (servescope._speedups_py), as
    pyinstrument runs its tests over its C and its Python stat profilers. ``speedups.stage`` and
    ``speedups.trace`` are servescope's over that twin, and a Recorder folds with that twin's
    ``fold_rows`` while the test runs."""
    from servescope import _speedups_py, recorder, timing

    if request.param == "python":
        module = _speedups_py
    else:
        try:
            from servescope import _speedups as module
        except ImportError:
            pytest.skip("the C extension is not built (no C compiler when servescope was installed)")
    stage_cls, trace_cls, stage, shared = timing._twin_api(module)
    monkeypatch.setattr(recorder, "fold_rows", module.fold_rows)
    return Twin(request.param, module, stage_cls, trace_cls, stage, shared)


@pytest.fixture
def torch_on_two_cpus(monkeypatch: pytest.MonkeyPatch):
    """torch, with servescope.serve's runtime seeing two CPUs and no ``OMP_NUM_THREADS`` (so it
    adapts the threads itself); torch's thread count is put back after the test."""
    torch = pytest.importorskip("torch")
    from servescope.serve import runtime as rt

    before = torch.get_num_threads()
    monkeypatch.setattr(rt, "available_cpus", lambda: 2.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield torch
    torch.set_num_threads(before)
