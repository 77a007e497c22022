"""Moved to ``servescope.load.bench`` (this path is kept until the next release)."""

from ._moved import alias

alias(__name__)
