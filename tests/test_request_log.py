"""request_log.py: one CSV row per measured request, on hand-made results (no clock)."""

from __future__ import annotations

import csv

import pytest

from servescope.load.bench import results_report
from servescope.exceptions import ConfigError
from servescope.load.loadgen import CHUNKED, OVERSIZED, SSE, Result
from servescope.load.request_log import COLUMNS, RequestLog, request_rows

MS = 1_000_000


def results() -> list[Result]:
    return [
        Result(0, 0, 5 * MS, 200, None, None),  # warm-up: scheduled before the measured window
        Result(100 * MS, 103 * MS, 110 * MS, 200, b"infer;dur=4.5, total;dur=6", None),  # sent 3 ms late
        Result(110 * MS, 110 * MS, 111 * MS, 503, None, None),
        Result(120 * MS, 120 * MS, 150 * MS, 0, None, "timeout"),
        Result(130 * MS, 130 * MS, 170 * MS, 200, None, None, (SSE, 132 * MS, [140 * MS, 150 * MS, 165 * MS])),
        Result(140 * MS, 140 * MS, 145 * MS, 200, OVERSIZED, None, (CHUNKED, 141 * MS, [144 * MS])),  # one chunk: plain
    ]


def test_one_row_per_measured_request_with_the_reports_latency(tmp_path):
    log = RequestLog(tmp_path / "r.csv")
    log.add("rate", 50.0, results(), 100 * MS)
    rep = results_report(results(), measure_from_ns=100 * MS)
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == log.rows == rep.load.requests.measured == 5
    assert list(rows[0]) == list(COLUMNS)
    late = rows[0]
    assert (late["mode"], late["level"], late["scheduled_ms"], late["sent_ms"]) == ("rate", "50", "0.0", "3.0")
    assert float(late["latency_ms"]) == 10.0 and float(late["latency_from_send_ms"]) == 7.0  # counted from when it was due
    assert late["server_timing"] == "infer=4.5;total=6" and late["ttft_ms"] == ""
    assert [r["error"] for r in rows] == ["", "HTTP 503", "timeout", "", ""]
    assert [r["status"] for r in rows] == ["200", "503", "0", "200", "200"]
    ok = sorted(float(r["latency_ms"]) for r in rows if not r["error"])
    assert ok == sorted([10.0, 40.0, 5.0]) and max(ok) == rep.latency["max_ms"]
    streamed = rows[3]
    assert (streamed["ttfb_ms"], streamed["ttft_ms"], streamed["tokens"]) == ("2.0", "10.0", "3")
    assert rows[4]["tokens"] == "" and rows[4]["server_timing"] == "too large"


def test_levels_are_appended_one_after_another(tmp_path):
    log = RequestLog(tmp_path / "r.csv")
    log.add("concurrency", 1, results(), 100 * MS)
    log.add("concurrency", 4, results(), 0)
    with open(tmp_path / "r.csv", newline="") as f:
        levels = [r["level"] for r in csv.DictReader(f)]
    assert levels == ["1"] * 5 + ["4"] * 6 and log.rows == 11


def test_a_path_that_cannot_be_written_fails_before_any_load(tmp_path):
    with pytest.raises(ConfigError, match="cannot write the request log"):
        RequestLog(tmp_path / "missing" / "r.csv")


def test_rows_are_in_the_columns_order():
    [row] = list(request_rows(results()[1:2], measure_from_ns=100 * MS, mode="rate", level=2.5))
    assert len(row) == len(COLUMNS) and row[:2] == ["rate", "2.5"]
