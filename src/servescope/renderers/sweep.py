"""The sweep table: throughput and latency per load level, and where it saturates."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def saturation(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first level past which throughput grows < 10% while p95 grows > 50%."""
    for prev, row in zip(rows, rows[1:]):
        t0, t1 = prev.get("throughput_rps") or 0, row.get("throughput_rps") or 0
        l0, l1 = prev.get("p95_ms"), row.get("p95_ms")
        if t0 and l0 and l1 and t1 < t0 * 1.10 and l1 > l0 * 1.5:
            return prev
    return None


def render_sweep(rows: list[dict[str, Any]], *, console: Console) -> None:
    table = Table(title="Throughput vs latency", header_style="bold", show_edge=False)
    for col in ("level", "throughput req/s", "p50 ms", "p95 ms", "p99 ms", "errors"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['mode']}={r['level']:g}",
            f"{r['throughput_rps'] or 0:,.1f}",
            *(f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("p50_ms", "p95_ms", "p99_ms")),
            str(r["errors"]),
        )
    console.print(table)
    sat = saturation(rows)
    if sat is not None:
        console.print(
            f"Saturates at about {sat['throughput_rps']:,.0f} req/s ({sat['mode']}={sat['level']:g}): "
            "more load only adds latency."
        )
    console.print()
