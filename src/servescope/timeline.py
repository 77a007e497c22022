"""Moved to ``servescope.load.timeline`` (this path is kept until the next release)."""

from ._moved import alias

alias(__name__)
