"""The before/after table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .terminal import stage_label


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3f}"


def _change(row: dict[str, Any]) -> str:
    r = row["ratio"]
    if r is None:
        return "-"
    if r == 0:
        return "gone"
    return f"{1 / r:.1f}x faster" if r < 1 and "throughput" not in row["metric"] else f"x{r:.2f}"


def render_compare(table: dict[str, Any], *, console: Console, before: str = "before", after: str = "after") -> None:
    t = Table(title="Before / after", header_style="bold", show_edge=False)
    for col in ("", before, after, "change", "beyond noise?"):
        t.add_column(col, justify="right" if col else "left")
    for row in table["summary"]:
        t.add_row(row["metric"], _fmt(row["before"]), _fmt(row["after"]), _change(row), _sig(row))
    t.add_section()
    for row in table["stages"]:
        t.add_row(f"{stage_label(row['metric'])} (mean ms)", _fmt(row["before"]), _fmt(row["after"]), _change(row), _sig(row))
    console.print(t)


def _sig(row: dict[str, Any]) -> str:
    s = row["significant"]
    return "n/a" if s is None else ("yes" if s else "no")
