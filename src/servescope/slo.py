"""Moved to ``servescope.load.slo`` (this path is kept until the next release)."""

from ._moved import alias

alias(__name__)
