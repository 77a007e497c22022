"""The before/after table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..compare import Change, Comparison
from .base import console_text
from .terminal import MAX_STAGES_SHOWN, plain, stage_label

__all__ = ["ComparisonRenderer", "render_compare"]


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3f}"


class ComparisonRenderer:
    """The before/after table of a ``Comparison``, its columns headed ``before`` and ``after``;
    printed to ``console`` when one is given, and returned as plain text.

        ComparisonRenderer(console=Console(), before="FastAPI", after="servescope.serve").render(compare(a, b))
    """

    def __init__(self, *, console: Console | None = None, before: str = "before", after: str = "after", width: int = 110) -> None:
        self.console = console
        self.before = before
        self.after = after
        self.width = width

    def __repr__(self) -> str:
        return f"ComparisonRenderer(console={self.console!r}, before={self.before!r}, after={self.after!r}, width={self.width})"

    def render(self, comparison: Comparison) -> str:
        t = Table(title=Text(f"Before / after: {plain(comparison.title, one_line=True)}"), header_style="bold", show_edge=False)
        for col in ("", self.before, self.after, "change", "95% interval", "beyond noise?"):
            t.add_column(col, justify="right" if col else "left")
        for row in comparison.summary:
            t.add_row(row.metric, _fmt(row.before), _fmt(row.after), row.words, row.interval_words, _sig(row))
        t.add_section()
        stages = comparison.stages
        for row in stages[:MAX_STAGES_SHOWN]:  # names from the reports: plain text, never markup
            name = Text(f"{plain(stage_label(row.metric), one_line=True)} (mean ms)")
            t.add_row(name, _fmt(row.before), _fmt(row.after), row.words, row.interval_words, _sig(row))
        parts: list[Any] = [t]
        for note in comparison.notes:
            parts.append(Text(plain(note), style="yellow"))
        if len(stages) > MAX_STAGES_SHOWN:
            parts.append(Text(f"{len(stages) - MAX_STAGES_SHOWN:,} more stages not shown", style="yellow"))
        return console_text(parts, console=self.console, width=self.width)


def render_compare(table: Comparison, *, console: Console, before: str = "before", after: str = "after") -> None:
    """``ComparisonRenderer(console=console, before=before, after=after).render(table)``, printed only."""
    ComparisonRenderer(console=console, before=before, after=after).render(table)


def _sig(row: Change) -> str:
    if row.ratio is None:  # in one report only: nothing to compare
        return "-"
    s = row.significant
    return "can't tell" if s is None else ("yes" if s else "no")
