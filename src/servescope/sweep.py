"""A load sweep's curve: one row per level (throughput and latency), and where it saturates.

    rows = sweep_summary(run_bench(BenchOptions(url=url, concurrency=[1, 4, 16, 64])))
    knee = saturation(rows)   # the last level worth its load, or None

Analysis, not presentation: the renderers draw these rows, the CLI stores them in the report.
"""

from __future__ import annotations

from typing import Any

from .report import Report

__all__ = ["saturation", "sweep_report", "sweep_summary"]


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
            }
        )
    return rows


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
    from .sections import Sweep

    final = reports[-1]
    if len(reports) > 1:
        final.sweep = Sweep.from_dict(
            {"rows": sweep_summary(reports), "levels": [r.to_dict(distributions=False, samples=False) for r in reports]}
        )
    return final
