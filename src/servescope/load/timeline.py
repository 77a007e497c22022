"""Latency over time: the measured window cut into windows, each with its requests' figures.

    section = timeline(measured_results, start_ns=measure_from, end_ns=until)
    [(w.start_s, w.p99_ms) for w in section.windows]

A request belongs to the window it *started* in: the earlier of its scheduled and its actual
send time, as the headline's latency counts from. So in open loop a stall shows where it
happened: the requests due during it wait for it, and their window's p99 and max rise (in
closed loop fewer requests start during it, and the one caught in it shows in ``max``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..sections import Timeline, Window
from .wire import Result, error_kind

__all__ = ["MAX_WINDOWS", "MIN_PER_WINDOW", "WIDTHS_S", "timeline", "window_width"]

#: At most this many windows, whatever the run's length.
MAX_WINDOWS = 120
#: Windows wide enough for this many requests each, on average: a p99 of two requests says little.
MIN_PER_WINDOW = 5
#: The widths a window may have (seconds): round numbers, so the axis reads plainly.
WIDTHS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


def window_width(span_s: float, requests: int) -> float:
    """The narrowest round width giving at most ``MAX_WINDOWS`` windows over ``span_s``, and
    ``MIN_PER_WINDOW`` requests per window on average (a handful of requests: one window the
    run's length). A 10 s run at 50 requests/s: 0.1 s; at 5 requests/s: 1 s."""
    need = max(span_s / MAX_WINDOWS, min(span_s, span_s * MIN_PER_WINDOW / max(requests, 1)))
    return next((w for w in WIDTHS_S if w >= need * (1 - 1e-9)), WIDTHS_S[-1] * math.ceil(need / WIDTHS_S[-1]))


def timeline(results: Sequence[Result], *, start_ns: int, end_ns: int) -> Timeline:
    """The ``Timeline`` of these measured requests over ``start_ns``..``end_ns`` (ns, the
    generator's clock); a request that started before ``start_ns`` counts in the first window."""
    n = len(results)
    span_ns = max(end_ns - start_ns, 1)
    width = window_width(span_ns / 1e9, n)
    if n == 0:
        return Timeline(window_s=float(width), windows=[])
    sched = np.fromiter((r.scheduled_ns for r in results), dtype=np.int64, count=n)
    sent = np.fromiter((r.sent_ns for r in results), dtype=np.int64, count=n)
    done = np.fromiter((r.done_ns for r in results), dtype=np.int64, count=n)
    ok = np.fromiter((error_kind(r) is None for r in results), dtype=bool, count=n)
    began = np.minimum(sched, sent)
    latency = (done - began) / 1e6
    width_ns = round(width * 1e9)
    index = np.maximum((began - start_ns) // width_ns, 0)
    count = max(math.ceil(span_ns / width_ns), int(index.max()) + 1)
    oks = np.bincount(index[ok], minlength=count)
    errors = np.bincount(index[~ok], minlength=count)
    order = np.argsort(index[ok], kind="stable")
    good_index, good_latency = index[ok][order], latency[ok][order]
    bounds = np.searchsorted(good_index, np.arange(count + 1))
    windows = []
    for i in range(count):
        lat = good_latency[bounds[i] : bounds[i + 1]]
        p50 = p99 = top = None
        if lat.size:
            p50, p99 = (round(float(v), 4) for v in np.percentile(lat, [50, 99]))
            top = round(float(lat.max()), 4)
        windows.append(
            Window(start_s=round(i * width, 6), ok=int(oks[i]), errors=int(errors[i]), p50_ms=p50, p99_ms=p99, max_ms=top)
        )
    return Timeline(window_s=float(width), windows=windows)
