"""Moved to ``servescope.load.cluster`` (this path is kept until the next release)."""

from ._moved import alias

alias(__name__)
