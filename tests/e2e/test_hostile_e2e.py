"""What bench and ``servescope report URL`` do with a broken or hostile server (tests/hostile.py
on uvicorn, loopback): every case ends, within its bounds, with the run's data or one line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from servescope import ReportError
from servescope.load.bench import BenchOptions, run_bench
from servescope.report import Report

from .conftest import start_server, stop

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hostile():
    proc, port = start_server("hostile:app", env={"SERVESCOPE_TEST_DRIP_S": "0.3"})
    yield f"http://127.0.0.1:{port}"
    stop(proc)


def bench(url: str, n: int = 20):
    [rep] = run_bench(BenchOptions(url=url, concurrency=[2], requests=n, warmup_s=0, timeout_s=20))
    return rep


def test_bench_goes_on_past_durations_no_stage_can_have(hostile):
    rep = bench(f"{hostile}/huge-dur")  # 'infer;dur=1e300, total;dur=1e13': OverflowError before
    assert rep.latency["count"] == 20 and not rep.errors
    timing = rep.load.server_timing
    assert timing.malformed == 20 and "infer" not in rep.stages
    assert timing.hint.startswith("every Server-Timing header the server sent was malformed")  # not "sent none"


def test_bench_keeps_at_most_8_kib_of_server_timing_per_response(hostile):
    for path in ("/many-timing", "/big-timing"):  # 20,000 lines; one line of 1.2 MB
        rep = bench(f"{hostile}{path}")
        assert rep.latency["count"] == 20
        assert rep.load.server_timing.too_large == 20 and rep.load.server_timing.malformed == 20


def test_report_url_is_bounded_in_size(hostile):
    for path in ("/big", "/big-chunked"):  # 16 MB, with and without a Content-Length
        with pytest.raises(ReportError, match="the 1,048,576 bytes read at most"):
            Report.fetch(f"{hostile}{path}", max_bytes=1 << 20)


def test_report_url_is_bounded_in_time_overall(hostile):
    t0 = time.monotonic()
    with pytest.raises(ReportError, match="no complete answer within 1.5 s"):
        Report.fetch(f"{hostile}/drip", timeout_s=1.5)  # a byte every 0.3 s: no read ever times out
    assert time.monotonic() - t0 < 10


def test_report_url_follows_redirects_to_http_only(hostile):
    assert Report.fetch(f"{hostile}/to-report").latency["count"] == 1
    with pytest.raises(ReportError, match="only http:// and https:// URLs are fetched, not 'ftp://"):
        Report.fetch(f"{hostile}/to-ftp")


def test_report_url_of_100000_stages_prints_in_bounded_time(hostile):
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "report", f"{hostile}/stages"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "99,900 more stages not shown" in p.stdout
