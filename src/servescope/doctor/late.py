"""Libraries that arrive late: an endpoint that imports its model library inside the handler
(``joblib.load`` unpickling a scikit-learn pipeline imports scikit-learn there; a lazy
``from transformers import AutoModel`` in the first request) is probed from the moment the
library is imported, whenever that is.

    watch = ImportWatch(("sklearn", "transformers."), on_import=lambda name: probes.install_late())
    watch.start() ... watch.stop()

A finder first on ``sys.meta_path`` that finds nothing itself: for a watched name it asks the
other finders, and wraps the loader it gets so that ``on_import(name)`` runs right after the
module's own code. Every other import goes straight through.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable

__all__ = ["ImportWatch"]


class _Loader(importlib.abc.Loader):
    """The real loader, and a call after the module has run."""

    def __init__(self, loader: Any, after: Callable[[], None]) -> None:
        self._loader, self._after = loader, after

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # (resources and reloads go to the real one)
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._after()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class ImportWatch(importlib.abc.MetaPathFinder):
    def __init__(self, prefixes: tuple[str, ...], on_import: Callable[[str], None], exact: tuple[str, ...] = ()) -> None:
        """``prefixes``: names watched with all they start with; ``exact``: a package alone, not
        its submodules (torch's hundreds, imported while it loads)."""
        self.prefixes, self.on_import, self.exact = prefixes, on_import, exact
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not (fullname.startswith(self.prefixes) or fullname in self.exact) or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._local.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _Loader(loader, lambda: self._fire(fullname))
        return spec

    def _fire(self, name: str) -> None:
        try:
            self.on_import(name)
        except Exception:  # a probe that cannot attach must not break the user's import
            pass

    def start(self) -> None:
        sys.meta_path.insert(0, self)

    def stop(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
