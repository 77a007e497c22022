"""The modules that moved into ``servescope.load`` keep their old import paths for one
release: the old name is the same module object (patched alike), with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str) -> None:
    """Make the module being imported as ``old`` (``servescope.bench``) be ``servescope.load.bench``."""
    name = old.rpartition(".")[2]
    warnings.warn(f"{old} moved to servescope.load.{name}; the old path goes in the next release", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(f"servescope.load.{name}")
