"""Find the user's object from ``path/to/file.py:name`` or ``package.module:name``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from .exceptions import ConfigError


#: The name a file imported by path gets: ``servescope_target_<stem>`` (not importable elsewhere).
FILE_MODULE_PREFIX = "servescope_target_"


def check_target_spec(spec: str) -> None:
    """The checks ``load_target`` makes before importing anything: the form, and that the
    file exists. One clear line (``ConfigError``) for a spec that cannot work."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"target {spec!r} must look like path/to/file.py:name or package.module:name")
    where, _, name = spec.rpartition(":")
    if not where or not name.isidentifier():
        raise ConfigError(f"target {spec!r} must look like path/to/file.py:name or package.module:name")
    if (where.endswith(".py") or "/" in where or "\\" in where) and not Path(where).resolve().is_file():
        raise ConfigError(f"target file {where!r} does not exist")


def load_target(spec: str) -> Any:
    """Import ``spec`` and return the named object. The file's folder goes on ``sys.path``
    (as uvicorn does), so its own imports work. Raises ``ConfigError`` with one clear line."""
    check_target_spec(spec)
    where, _, name = spec.rpartition(":")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).resolve()
        if not path.is_file():
            raise ConfigError(f"target file {where!r} does not exist")
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = f"{FILE_MODULE_PREFIX}{path.stem}"
        spec_obj = importlib.util.spec_from_file_location(module_name, path)
        if spec_obj is None or spec_obj.loader is None:
            raise ConfigError(f"cannot import {where!r}")
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[module_name] = module
        try:
            spec_obj.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ConfigError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from None
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise ConfigError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{where!r} has no {name!r}") from None
