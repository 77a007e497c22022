"""GPU timing on a simulated stream: why host clocks lie, and how events and sync fix it."""

from __future__ import annotations

import pytest

from servescope import CudaEventClock, SyncClock, WallClock, stage, trace


def request(gpu) -> None:
    """preprocess on CPU (1 ms), a 5 ms kernel launched in infer, then a copy back (.cpu())."""
    with stage("preprocess"):
        gpu.cpu(1)
    with stage("infer"):
        gpu.launch(5)  # returns after queueing the kernel
    with stage("to_host"):
        gpu.synchronize()  # .cpu() waits for the kernel...
        gpu.cpu(0.1)  # ...then copies


def test_host_clock_blames_the_stage_that_synchronises(gpu):
    with trace(clock=WallClock(gpu.now)) as t:
        request(gpu)
    assert t.durations_ms["infer"] == pytest.approx(0.01)
    assert t.durations_ms["to_host"] == pytest.approx(5.09)


def test_cuda_events_charge_kernels_to_the_stage_that_launched_them(gpu):
    with trace(clock=CudaEventClock(event=gpu.event, now=gpu.now)) as t:
        request(gpu)
        syncs_during_request = gpu.syncs
    assert syncs_during_request == 1  # only the user's own .cpu(): no stall added mid-request
    assert t.durations_ms["preprocess"] == pytest.approx(1.0)
    assert t.durations_ms["infer"] == pytest.approx(5.0, abs=0.011)
    assert t.durations_ms["to_host"] == pytest.approx(0.1)
    assert t.total_ms == pytest.approx(6.1, abs=0.02)


def test_sync_mode_is_right_too_but_synchronises_at_every_boundary(gpu):
    with trace(clock=SyncClock(synchronize=gpu.synchronize, now=gpu.now)) as t:
        request(gpu)
    assert t.durations_ms["infer"] == pytest.approx(5.0)
    assert t.durations_ms["to_host"] == pytest.approx(0.1)
    assert gpu.syncs >= 7  # one per boundary plus the user's


def test_events_mode_resolves_once_at_the_end(gpu):
    events = []

    def event(enable_timing=False):
        ev = gpu.event(enable_timing)
        events.append(ev)
        return ev

    with trace(clock=CudaEventClock(event=event, now=gpu.now)):
        with stage("infer"):
            gpu.launch(2)
        assert gpu.syncs == 0
    assert len(events) == 4  # trace start/end + stage start/end
    assert gpu.syncs >= 1


def test_a_busy_device_at_the_start_stays_in_the_total_as_other(gpu):
    gpu.launch(3)  # another request's 3 ms kernel is still running when this one starts
    with trace(clock=CudaEventClock(event=gpu.event, now=gpu.now)) as t:
        with stage("infer"):
            gpu.launch(5)
        with stage("to_host"):
            gpu.synchronize()
            gpu.cpu(0.1)
    assert t.durations_ms["infer"] == pytest.approx(5.0, abs=0.011)  # still the kernel's own time
    assert t.durations_ms["to_host"] == pytest.approx(0.1)
    # the client waited 8.1 ms: the 3 ms behind the other kernel are not hidden
    assert t.total_ms == pytest.approx(8.09, abs=0.02)
    assert t.durations_ms["other"] == pytest.approx(2.99, abs=0.02)


def test_device_work_after_the_host_is_done_counts_in_the_total(gpu):
    with trace(clock=CudaEventClock(event=gpu.event, now=gpu.now)) as t:
        with stage("infer"):
            gpu.launch(4)  # never waited for inside the request
    assert t.total_ms == pytest.approx(4.0, abs=0.02)  # the device's span, longer than the host's
    assert t.durations_ms["infer"] == pytest.approx(4.0, abs=0.011)


def test_events_that_cannot_be_read_fall_back_to_host_clocks_and_the_request_goes_on(gpu, caplog, monkeypatch):
    class OtherDeviceEvent:  # an event recorded on a second GPU: torch refuses to compare them
        def __init__(self, enable_timing=False):
            self.inner = gpu.event(enable_timing)

        def record(self):
            self.inner.record()

        def synchronize(self):
            self.inner.synchronize()

        def elapsed_time(self, other):
            raise RuntimeError("Both events must be recorded on the same device")

    monkeypatch.setattr(CudaEventClock, "failures", 0)
    with caplog.at_level("WARNING", logger="servescope"):
        for _ in range(2):
            with trace(clock=CudaEventClock(event=OtherDeviceEvent, now=gpu.now)) as t:
                request(gpu)
    assert t.error is None  # the request itself is unharmed
    assert t.durations_ms["to_host"] == pytest.approx(5.09)  # what host clocks see
    assert t.total_ms == pytest.approx(6.1, abs=0.02)
    assert CudaEventClock.failures >= 2  # counted, warned about once
    assert sum("could not be read" in r.getMessage() for r in caplog.records) == 1
