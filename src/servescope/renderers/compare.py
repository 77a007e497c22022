"""The before/after table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .terminal import MAX_STAGES_SHOWN, plain, stage_label


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
    stages = table["stages"]
    for row in stages[:MAX_STAGES_SHOWN]:  # names from the reports: plain text, never markup
        name = Text(f"{plain(stage_label(row['metric']), one_line=True)} (mean ms)")
        t.add_row(name, _fmt(row["before"]), _fmt(row["after"]), _change(row), _sig(row))
    console.print(t)
    if len(stages) > MAX_STAGES_SHOWN:
        console.print(Text(f"{len(stages) - MAX_STAGES_SHOWN:,} more stages not shown", style="yellow"))


def _sig(row: dict[str, Any]) -> str:
    s = row["significant"]
    return "n/a" if s is None else ("yes" if s else "no")
