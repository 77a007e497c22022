"""Renderers: a Report in, a view out. One module per format."""

from __future__ import annotations

from .json import render_json
from .terminal import render_terminal, stage_label

__all__ = ["render_json", "render_terminal", "stage_label"]
