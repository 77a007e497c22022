"""What every renderer is: a class per format, options at construction, ``render(report) -> str``.

    print(HTMLRenderer().render(report))
    TerminalRenderer(console=Console()).render(report)   # prints, and returns the plain text

pyinstrument's ``Renderer.render(session)`` is the model. Views of something other than one
report (a before/after ``Comparison``, a sweep's rows) follow the same shape with their own
subject: options at construction, ``render(subject) -> str``.
"""

from __future__ import annotations

import io
from typing import Any, Protocol, runtime_checkable

from rich.console import Console, Group

from ..report import Report

__all__ = ["Renderer", "console_text"]


@runtime_checkable
class Renderer(Protocol):
    """Formats a Report as text (terminal, JSON, HTML ...)."""

    def render(self, report: Report) -> str:
        """The report in this format."""
        ...


def console_text(parts: list[Any], *, console: Console | None, width: int) -> str:
    """Print ``parts`` (rich renderables) to ``console`` when one is given; return them as plain
    text ``width`` columns wide, whatever the console."""
    group = Group(*parts)
    if console is not None:
        console.print(group)
    buf = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    buf.print(group)
    return buf.file.getvalue()  # type: ignore[attr-defined]
