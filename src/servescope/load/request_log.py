"""The request log: one CSV row per measured request of a ``servescope bench`` run.

    log = RequestLog("requests.csv")
    reports = run_bench(options, on_results=log.add)
    log.rows        # == the levels' load.requests.measured, summed

The report keeps statistics; the log keeps each request, for a spreadsheet or pandas
(``pd.read_csv``). Times are milliseconds; offsets count from the start of the level's
measured window; latency counts as the report's does (from the earlier of the scheduled and
the actual send: coordinated omission corrected), ``latency_from_send_ms`` from the send.
Warm-up requests are left out, as they are from the report.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator, Sequence

from ..exceptions import ConfigError, ServerTimingError
from ..servertiming import server_timing_durations
from .wire import OVERSIZED, Result, error_kind, streamed

__all__ = ["COLUMNS", "RequestLog", "request_rows"]

#: The CSV's header, in order (docs/bench.md says what each holds).
COLUMNS = (
    "mode", "level", "scheduled_ms", "sent_ms", "latency_ms", "latency_from_send_ms", "status", "error",
    "ttfb_ms", "ttft_ms", "tokens", "server_timing",
)  # fmt: skip


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def _stages(value: bytes | None) -> str:
    """``infer=5.2;serialize=0.3;total=6`` from the Server-Timing header; '' without one."""
    if value is None:
        return ""
    if value == OVERSIZED:
        return "too large"
    try:
        stages, total = server_timing_durations(value.decode("latin-1"))
    except ServerTimingError:
        return "malformed"
    parts = [f"{name}={ms:g}" for name, ms in stages.items()]
    if total is not None:
        parts.append(f"total={total:g}")
    return ";".join(parts)


def request_rows(results: Sequence[Result], *, measure_from_ns: int, mode: str, level: float) -> Iterator[list[object]]:
    """A row (``COLUMNS``' order) for each result scheduled from ``measure_from_ns`` on.

    ``ttfb_ms``, ``ttft_ms`` and ``tokens`` are filled for streamed responses only (as the
    report counts them: Server-Sent Events, or chunked in two chunks or more), from the
    request's start as ``latency_ms`` is."""
    for r in results:
        if r.scheduled_ns < measure_from_ns:
            continue
        start = min(r.scheduled_ns, r.sent_ns)
        ttfb: object = ""
        ttft: object = ""
        tokens: object = ""
        if streamed(r) and error_kind(r) is None:
            _, head_ns, times = r.stream
            ttfb, tokens = _ms(head_ns - start), len(times)
            ttft = _ms(times[0] - start) if times else ""
        yield [
            mode, f"{level:g}", _ms(r.scheduled_ns - measure_from_ns), _ms(r.sent_ns - measure_from_ns),
            _ms(r.done_ns - start), _ms(r.done_ns - r.sent_ns), r.status, error_kind(r) or "",
            ttfb, ttft, tokens, _stages(r.server_timing),
        ]  # fmt: skip


class RequestLog:
    """A CSV file of per-request rows, one level after another (``add`` is ``run_bench``'s
    ``on_results``). The header is written at construction, so a path that cannot be written
    fails before any load is sent; each level's rows are appended as it ends, so an
    interrupted run keeps the levels that ran."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        #: the rows written so far
        self.rows = 0
        self._write([COLUMNS], "w")

    def add(self, mode: str, level: float, results: Sequence[Result], measure_from_ns: int) -> None:
        """The measured requests of one level (``mode`` "concurrency" or "rate")."""
        rows = list(request_rows(results, measure_from_ns=measure_from_ns, mode=mode, level=level))
        self._write(rows, "a")
        self.rows += len(rows)

    def _write(self, rows: Sequence[Sequence[object]], mode: str) -> None:
        try:
            with self.path.open(mode, newline="", encoding="utf-8") as f:
                csv.writer(f).writerows(rows)
        except OSError as exc:
            raise ConfigError(f"cannot write the request log {str(self.path)!r}: {exc.strerror or exc}") from None

    def __repr__(self) -> str:
        return f"RequestLog({str(self.path)!r}, rows={self.rows})"
