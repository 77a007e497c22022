"""timeline.py: latency over time, window by window, on hand-made results (no clock)."""

from __future__ import annotations

import pytest

from servescope import Report
from servescope.load.bench import results_report
from servescope.load.loadgen import Result
from servescope.load.timeline import MAX_WINDOWS, timeline, window_width

MS = 1_000_000


def open_loop_with_a_stall(*, stall_at_ms: int = 4000, stall_ms: int = 1000, seconds: int = 10) -> list[Result]:
    """100 requests/s on schedule (enough connections: each sent when due), served in 2 ms,
    except that nothing is answered during a stall: what was due in it is answered at its end."""
    out = []
    for k in range(seconds * 100):
        due = k * 10 * MS
        done = due + 2 * MS
        if stall_at_ms * MS <= due < (stall_at_ms + stall_ms) * MS:
            done = (stall_at_ms + stall_ms) * MS + 2 * MS
        out.append(Result(due, due, done, 503 if k % 50 == 7 else 200, None, None))
    return out


def test_a_one_second_stall_is_a_spike_where_it_happened():
    rep = results_report(open_loop_with_a_stall(), measure_from_ns=0, measure_until_ns=10_000 * MS, open_loop=True)
    tl = rep.load.timeline
    assert tl.window_s == 0.1 and len(tl.windows) == 100
    peak = max(tl.windows, key=lambda w: w.max_ms or 0)
    assert peak.start_s == pytest.approx(4.0) and peak.max_ms == pytest.approx(1002, abs=1)
    inside = [w for w in tl.windows if 4.0 <= w.start_s + 1e-9 < 5.0]
    outside = [w for w in tl.windows if not 4.0 <= w.start_s + 1e-9 < 5.0]
    # every window of the stall stands out; its first half waits over half a second at the median
    assert all(w.p99_ms > 50 for w in inside) and all(w.p50_ms > 500 for w in inside[:5])
    assert all(w.max_ms <= 2.0 for w in outside)


def test_the_windows_count_every_measured_request_once():
    rep = results_report(open_loop_with_a_stall(), measure_from_ns=2000 * MS, measure_until_ns=10_000 * MS)
    tl = rep.load.timeline
    assert sum(w.ok for w in tl.windows) == rep.load.requests.ok == rep.latency["count"]
    assert sum(w.errors for w in tl.windows) == rep.load.requests.measured - rep.load.requests.ok == sum(rep.errors.values())
    assert tl.windows[0].start_s == 0.0  # offsets from the measured window's start, warm-up left out
    assert all(isinstance(w.ok, int) and isinstance(w.errors, int) for w in tl.windows)


def test_one_connection_behind_a_stall_shows_it_from_the_schedule():
    # one connection: requests due during a 500 ms stall at t=1 s are sent late; counted from
    # when they were due, their window's p99 climbs, though each was served in 1 ms
    results, free = [], 0
    for k in range(300):
        due = k * 10 * MS
        sent = max(due, free)
        free = sent + (500 * MS if k == 100 else 1 * MS)
        results.append(Result(due, sent, free, 200, None, None))
    tl = results_report(results, measure_from_ns=0).load.timeline
    peak = max(tl.windows, key=lambda w: w.p99_ms or 0)
    assert 1.0 <= peak.start_s + 1e-9 < 1.5 and peak.p99_ms >= 400
    assert max(w.p99_ms for w in tl.windows if w.start_s >= 1.6) < 5


def test_a_closed_loop_stall_shows_as_no_request_started():
    # closed loop, one connection: one request takes 1 s at t=2 s; none starts until it ends
    results, t = [], 0
    while t < 5000 * MS:
        took = 1000 * MS if 2000 * MS <= t < 2010 * MS else 10 * MS
        results.append(Result(t, t, t + took, 200, None, None))
        t += took
    tl = results_report(results, measure_from_ns=0).load.timeline
    slow = next(w for w in tl.windows if w.max_ms and w.max_ms >= 1000)
    after = [w for w in tl.windows if slow.start_s < w.start_s < slow.start_s + 0.9]
    assert after and all(w.ok == 0 and w.p99_ms is None for w in after)


@pytest.mark.parametrize(
    "span_s, requests, width",
    [(10, 500, 0.1), (10, 50, 1), (5, 250, 0.1), (120, 100_000, 1), (600, 60_000, 5), (0.2, 1000, 0.002), (10, 0, 10)],
)
def test_windows_are_round_and_at_most_about_120(span_s, requests, width):
    assert window_width(span_s, requests) == width
    assert span_s / width <= MAX_WINDOWS + 1e-9


def test_a_run_longer_than_every_round_width_still_has_at_most_120_windows():
    assert window_width(10 * 24 * 3600, 10**7) * MAX_WINDOWS >= 10 * 24 * 3600


def test_no_request_no_window():
    tl = timeline([], start_ns=0, end_ns=10 * 10**9)
    assert tl.windows == [] and tl.window_s == 10


def test_the_timeline_loads_back_from_json_and_is_left_out_of_combined_reports_with_why():
    rep = results_report(open_loop_with_a_stall(), measure_from_ns=0, measure_until_ns=10_000 * MS)
    back = Report.from_json(rep.to_json())
    assert back.load.timeline == rep.load.timeline
    both = Report.combine([rep, back])
    assert both.load.timeline is None
    assert "own run" in both.meta["not_combined"]["load.timeline"]
