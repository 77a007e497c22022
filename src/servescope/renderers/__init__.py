"""Renderers: a Report in, a view out. One module per format, one class per view, each with
options at construction and ``render(subject) -> str`` (the ``Renderer`` protocol, base.py).

    TerminalRenderer, JSONRenderer, HTMLRenderer      render(report)
    ComparisonRenderer, ComparisonHTMLRenderer        render(comparison)   servescope.compare
    SweepRenderer                                     render(rows)         servescope.load.sweep

The module-level functions (render_terminal, render_json, render_html ...) are thin wrappers.
"""

from __future__ import annotations

from .base import Renderer
from .compare import ComparisonRenderer
from .html import ComparisonHTMLRenderer, HTMLRenderer
from .json import JSONRenderer, render_json
from .sweep import SweepRenderer
from .terminal import TerminalRenderer, render_terminal, stage_label

__all__ = [
    "ComparisonHTMLRenderer",
    "ComparisonRenderer",
    "HTMLRenderer",
    "JSONRenderer",
    "Renderer",
    "SweepRenderer",
    "TerminalRenderer",
    "render_json",
    "render_terminal",
    "stage_label",
]
