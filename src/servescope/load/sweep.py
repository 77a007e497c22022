"""A load sweep's curve: one row per level (throughput and latency), and where it saturates.

    rows = sweep_summary(run_bench(BenchOptions(url=url, concurrency=[1, 4, 16, 64])))
    knee = saturation(rows)   # the last level worth its load, or None

Analysis, not presentation: the renderers draw these rows, the CLI stores them in the report.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..exceptions import ConfigError
from ..report import Report
from ..sections import FindMax

__all__ = ["find_max", "find_max_report", "saturation", "sweep_report", "sweep_summary"]


def sweep_summary(reports: list[Report]) -> list[dict[str, Any]]:
    """One row per level: the throughput-latency curve."""
    rows = []
    for rep in reports:
        meta = rep.meta
        rows.append(
            {
                "level": meta.get("concurrency", meta.get("rate")),
                "mode": "concurrency" if "concurrency" in meta else "rate",
                "throughput_rps": rep.load.throughput_rps if rep.load is not None else None,
                "p50_ms": rep.latency.get("p50_ms"),
                "p95_ms": rep.latency.get("p95_ms"),
                "p99_ms": rep.latency.get("p99_ms"),
                "errors": sum(rep.errors.values()),
                **_stream_and_slo(rep),
            }
        )
    return rows


def _stream_and_slo(rep: Report) -> dict[str, Any]:
    out: dict[str, Any] = {}
    load = rep.load
    if load is not None and load.stream is not None:
        for name in ("ttft", "itl"):
            figures = getattr(load.stream, name) or {}
            out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = figures.get("p50_ms"), figures.get("p99_ms")
    if load is not None and load.slo is not None:
        out["goodput_rps"], out["slo_met"] = load.slo.goodput_rps, load.slo.met
    return out


def saturation(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first level past which throughput grows < 10% while p95 grows > 50%."""
    for prev, row in zip(rows, rows[1:]):
        t0, t1 = prev.get("throughput_rps") or 0, row.get("throughput_rps") or 0
        l0, l1 = prev.get("p95_ms"), row.get("p95_ms")
        if t0 and l0 and l1 and t1 < t0 * 1.10 and l1 > l0 * 1.5:
            return prev
    return None


def sweep_report(reports: list[Report]) -> Report:
    """The last level's report, carrying the whole sweep (a row per level, and each level's
    report without its distributions or samples) when there were several levels."""
    from ..sections import Sweep

    final = reports[-1]
    if len(reports) > 1:
        final.sweep = Sweep.from_dict({"rows": sweep_summary(reports), "levels": [_level(r) for r in reports]})
    return final


def _level(report: Report) -> dict[str, Any]:
    """A level's report without its distributions or samples (its streams' ones too)."""
    data = report.to_dict(distributions=False, samples=False)
    stream = (data.get("load") or {}).get("stream")
    if stream:
        stream["distributions"] = {}
    return data


def find_max(
    probe: Callable[[float], Report | None],
    *,
    start_rate: float = 10.0,
    resolution: float = 0.05,
    budget_s: float = 300.0,
    max_rate: float = 1e6,
    min_rate: float = 0.01,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[FindMax, list[Report]]:
    """The highest open-loop rate whose run meets its SLO: ``probe(rate)`` runs one level with
    an SLO (``load.slo``) and returns its report (None: interrupted, the search ends).

    From ``start_rate`` the rate doubles while it meets the SLO (halves while it misses), then
    bisects between the highest rate that met it and the lowest that missed until they are
    within ``resolution`` (0.05: 5%) of each other. A probe starts only when one more as long
    as the longest so far still fits in ``budget_s``. Returns the search's outcome and every
    probe's report, in the order run.

        outcome, reports = find_max(lambda r: run_bench(replace(options, rate=[r]))[0], start_rate=10)
    """
    if not start_rate > 0 or not 0 < resolution < 1 or not budget_s > 0:
        raise ConfigError(f"find_max needs start_rate > 0, 0 < resolution < 1, budget_s > 0; got {start_rate}, {resolution}, {budget_s}")
    t0 = clock()
    longest = 0.0
    reports: list[Report] = []
    met_at: float | None = None
    missed_at: float | None = None
    slo = ""

    def run(rate: float) -> bool | None:
        nonlocal longest, slo
        began = clock()
        rep = probe(rate)
        longest = max(longest, clock() - began)
        if rep is None:
            return None
        reports.append(rep)
        result = rep.load.slo if rep.load is not None else None
        if result is None:
            raise ConfigError("find_max: the probe's report was not judged on an SLO (BenchOptions.slo)")
        slo = result.slo
        return result.met and not rep.meta.get("interrupted")

    def fits() -> bool:
        return clock() - t0 + longest <= budget_s

    rate = start_rate
    stopped = ""
    while not stopped:
        if reports and not fits():
            stopped = "time budget spent"
            break
        met = run(rate)
        if met is None:
            stopped = "interrupted"
        elif met:
            met_at = rate if met_at is None else max(met_at, rate)
            if missed_at is not None:
                break
            if rate * 2 > max_rate:
                stopped = "rate cap reached"
            rate *= 2
        else:
            missed_at = rate if missed_at is None else min(missed_at, rate)
            if met_at is not None:
                break
            if rate / 2 < min_rate:
                stopped = "no rate met the SLO"
            rate /= 2
    while not stopped:
        assert met_at is not None and missed_at is not None
        if missed_at <= met_at * (1 + resolution):
            stopped = "resolution reached"
        elif not fits():
            stopped = "time budget spent"
        else:
            mid = (met_at + missed_at) / 2
            met = run(mid)
            if met is None:
                stopped = "interrupted"
            elif met:
                met_at = mid
            else:
                missed_at = mid
    outcome = FindMax(
        slo=slo, max_rate=met_at, missed_rate=missed_at, resolution=resolution, budget_s=budget_s,
        elapsed_s=round(clock() - t0, 3), stopped=stopped,
    )  # fmt: skip
    return outcome, reports


def find_max_report(outcome: FindMax, reports: list[Report]) -> Report:
    """The report of a ``find_max`` search: the highest rate that met the SLO (else the last
    probe), carrying every probe as a sweep (rows by rate) and the search's outcome."""
    from ..sections import Sweep

    by_rate = sorted(reports, key=lambda r: r.meta.get("rate", 0))
    best = [r for r in by_rate if r.load is not None and r.load.slo is not None and r.load.slo.met]
    final = best[-1] if best else reports[-1]
    final.sweep = Sweep.from_dict({"rows": sweep_summary(by_rate), "levels": [_level(r) for r in by_rate]})
    final.sweep.find_max = outcome
    return final
