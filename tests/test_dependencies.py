"""Every package servescope imports is declared in pyproject.toml: at import time in the
dependencies, lazily (inside a function) in the dependencies or an extra, or it is the user's
own (their framework, probed only when it is already there)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
#: import name -> distribution name, where they differ
DIST = {"prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-sdk", "sklearn": "scikit-learn", "pynvml": "nvidia-ml-py"}
#: imported only when present, with a fallback: uvloop (uvicorn[standard] brings it where it
#: builds), threadpoolctl (scikit-learn brings it), fastapi (the user's app, probed if loaded),
#: PIL (the doctor varies an image payload with it when the user's endpoint has it; without
#: it, the image is left as it is), transformers (bench --tokenizer reads a tokenizer folder
#: without tokenizer.json with the user's transformers; without it, it says so)
OPTIONAL = {"uvloop", "threadpoolctl", "fastapi", "PIL", "transformers"}


def _names(spec: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", s, maxsplit=1)[0].lower() for s in spec}


def _imports() -> tuple[set[str], set[str]]:
    """Top-level package names imported at module level, and inside functions."""
    top, lazy = set(), set()
    for path in (ROOT / "src" / "servescope").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        module_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                pkg = name.split(".")[0]
                if pkg in sys.stdlib_module_names or pkg in ("servescope", "__future__"):
                    continue
                (top if id(node) in module_level else lazy).add(pkg)
    return top, lazy


def test_every_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = _names(project["dependencies"])
    extras = set().union(*(_names(v) for k, v in project["optional-dependencies"].items() if k != "dev"))
    top, lazy = _imports()
    assert "httptools" in top  # the load generator's parser: imported at import time
    assert {p for p in top if DIST.get(p, p) not in required} == set()
    assert {p for p in lazy if DIST.get(p, p) not in required | extras and p not in OPTIONAL} == set()
