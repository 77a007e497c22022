"""What a stage costs, against the anchors users would otherwise reach for, in the same run.

    python bench/overhead.py            (make bench)

Prints ns per operation (median of 7 repeats) and each one's ratio to the bare class context
manager (two perf_counter_ns calls into a list), so numbers from a noisy machine compare.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import servescope
from servescope import Recorder, stage, trace

N = 20_000
REPEATS = 15
STAGES = ("validate", "preprocess", "to_device", "infer", "to_host", "postprocess", "serialize", "send")


def timed(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


class BareTimer:
    __slots__ = ("sink", "t0")

    def __init__(self, sink: list) -> None:
        self.sink = sink

    def __enter__(self):
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        self.sink.append(time.perf_counter_ns() - self.t0)


def bare(n: int) -> None:
    sink: list = []
    for _ in range(n):
        with BareTimer(sink):
            pass


def stage_outside_trace(n: int) -> None:
    for _ in range(n):
        with stage("infer"):
            pass


def stage_inside_trace(n: int) -> None:
    with trace():
        for _ in range(n):
            with stage("infer"):
                pass


def request_of_8_stages(recorder: Recorder | None) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n // 8):
            with trace(recorder=recorder):
                for name in STAGES:
                    with stage(name):
                        pass

    return run


def prometheus_observe() -> Callable[[int], None] | None:
    try:
        from prometheus_client import CollectorRegistry, Histogram
    except ImportError:
        return None
    h = Histogram("bench_seconds", "bench", registry=CollectorRegistry())

    def run(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            h.observe(time.perf_counter() - t0)

    return run


def otel_span() -> Callable[[int], None] | None:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    tracer = TracerProvider().get_tracer("bench")

    def run(n: int) -> None:
        for _ in range(n):
            with tracer.start_as_current_span("infer"):
                pass

    return run


def main() -> None:
    cases: list[tuple[str, Callable[[int], None], int]] = [("anchor: class CM, 2x perf_counter_ns into a list", bare, N)]
    prom = prometheus_observe()
    if prom:
        cases.append(("anchor: prometheus Histogram.observe (+2 perf_counter)", prom, N))
    otel = otel_span()
    if otel:
        cases.append(("anchor: OpenTelemetry SDK span (no processor)", otel, N // 10))
    cases += [
        ("servescope.stage outside any trace", stage_outside_trace, N),
        ("servescope.stage inside a trace (enter+exit)", stage_inside_trace, N // 10),
        ("per stage, request of 8 stages, trace open/close", request_of_8_stages(None), N),
        ("per stage, request of 8 stages, + Recorder.record", request_of_8_stages(Recorder()), N),
    ]
    # interleave the cases in every repeat and take each repeat's ratio to the anchor of that
    # same repeat: this machine's speed drifts by 2x over seconds, ratios taken together do not
    ns: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for _ in range(REPEATS):
        base = None
        for name, fn, n in cases:
            v = timed(fn, n)
            base = base or v
            ns[name].append(v)
            ratios[name].append(v / base)
    print(f"servescope {servescope.__version__}: ns/op (median of {REPEATS} interleaved repeats), ratio to the anchor")
    for name, _, _ in cases:
        print(f"  {name:<55} {statistics.median(ns[name]):8.0f} ns   {statistics.median(ratios[name]):5.2f}x")


if __name__ == "__main__":
    main()
