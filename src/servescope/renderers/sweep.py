"""The sweep table: throughput and latency per load level, and where it saturates."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..load.sweep import saturation
from .base import console_text

__all__ = ["SweepRenderer", "render_sweep"]


class SweepRenderer:
    """The sweep's table (rows from ``servescope.load.sweep.sweep_summary``) and where it saturates;
    printed to ``console`` when one is given, and returned as plain text.

        SweepRenderer(console=Console()).render(sweep_summary(reports))
    """

    def __init__(self, *, console: Console | None = None, width: int = 110) -> None:
        self.console = console
        self.width = width

    def __repr__(self) -> str:
        return f"SweepRenderer(console={self.console!r}, width={self.width})"

    def render(self, rows: list[dict[str, Any]]) -> str:
        return console_text(_sections(rows), console=self.console, width=self.width)


def render_sweep(rows: list[dict[str, Any]], *, console: Console) -> None:
    """``SweepRenderer(console=console).render(rows)``, printed only."""
    SweepRenderer(console=console).render(rows)


def _ms(value: float) -> str:
    """Three significant digits or so, as the headline prints them: 4.56, 45.6, 456, 4,567."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _sections(rows: list[dict[str, Any]]) -> list[Any]:
    table = Table(title="Throughput vs latency", header_style="bold", show_edge=False)
    streamed = [k for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms") if any(r.get(k) is not None for r in rows)]
    slo = any(r.get("slo_met") is not None for r in rows)
    cols = ["level", "throughput req/s", "p50 ms", "p95 ms", "p99 ms", *(k[:-3].replace("_", " ") + " ms" for k in streamed)]
    body = []
    for r in rows:
        cells = [
            f"{r['mode']}={r['level']:g}",
            f"{r['throughput_rps'] or 0:,.1f}",
            *(_ms(r[k]) if r.get(k) is not None else "-" for k in ("p50_ms", "p95_ms", "p99_ms", *streamed)),
        ]
        if slo:
            good = r.get("goodput_rps")
            cells += [f"{good:,.1f}" if good is not None else "-", {True: "met", False: "missed"}.get(r.get("slo_met"), "-")]
        body.append([*cells, str(r["errors"])])
    names = [*cols, *(["goodput req/s", "SLO"] if slo else []), "errors"]
    for i, col in enumerate(names):
        # the level names its row: never cut to "rate=2…" when the table is too wide for the screen
        level = {"no_wrap": True, "min_width": max((len(row[0]) for row in body), default=0)} if i == 0 else {}
        table.add_column(col, justify="right", **level)
    for row in body:
        table.add_row(*row)
    parts: list[Any] = [table]
    sat = saturation(rows)
    if sat is not None:
        parts.append(
            Text(
                f"Saturates at about {sat['throughput_rps']:,.0f} req/s ({sat['mode']}={sat['level']:g}): "
                "more load only adds latency."
            )
        )
    return [*parts, Text("")]
