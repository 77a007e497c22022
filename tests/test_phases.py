"""load.http: time to first byte and transfer from each measured success, the connections'
handshakes, merged across runs from their distributions."""

from __future__ import annotations

import pytest

from servescope.load.loadgen import Result
from servescope.load.phases import http_phases
from servescope.sections import Http, Load

MS = 1_000_000


def result(sent: float, first: float, done: float, status: int = 200, error: str | None = None) -> Result:
    return Result(int(sent * MS), int(sent * MS), int(done * MS), status, None, error, None, 0, None, int(first * MS))


def test_first_byte_and_transfer_come_from_the_successes_only():
    measured = [result(0, 20, 21), result(100, 130, 140), result(0, 5, 6, status=500), result(0, 0, 50, status=0, error="timeout")]
    http = http_phases(measured, dns_ns=int(0.2 * MS), connects=[(int(0.3 * MS), 0), (int(0.5 * MS), 0)])
    assert http.connections == 2 and http.dns_ms == 0.2 and http.tls is None
    assert http.ttfb["count"] == 2 and http.ttfb["max_ms"] == pytest.approx(30.0) and http.transfer["max_ms"] == pytest.approx(10.0)
    assert http.connect["max_ms"] == pytest.approx(0.5)
    assert http_phases([], dns_ns=None, connects=[]) is None


def test_tls_handshakes_are_kept_and_runs_merge_from_their_distributions():
    a = http_phases([result(0, 10, 11)], dns_ns=None, connects=[(int(1 * MS), int(4 * MS))])
    b = http_phases([result(0, 30, 31)], dns_ns=int(1 * MS), connects=[(int(2 * MS), int(6 * MS))])
    assert a.tls["p50_ms"] == pytest.approx(4.0)
    notes: dict[str, str] = {}
    both = Http.combine([a, None, b], notes)
    assert both.connections == 2 and both.ttfb["count"] == 2 and both.tls["max_ms"] == pytest.approx(6.0) and both.dns_ms == 1.0
    assert not notes
    assert Load.from_dict({"http": a.to_dict()}).http == a
