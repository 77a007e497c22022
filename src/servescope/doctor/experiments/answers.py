"""Do a fix's answers equal the endpoint's own? Answers of every shape endpoints return (a
response body, JSON, tensors, numpy arrays, nested dicts and lists), compared within float
noise: a fix that changes what the endpoint answers is not a fix the doctor may recommend.

An endpoint whose own answers differ from call to call (a timestamp, a request id, dropout
left on) cannot be compared value by value: then the structure is compared (keys, lengths,
shapes), and the verdict says so.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson

__all__ = ["Answers", "close", "plain"]

RTOL, ATOL = 1e-3, 1e-5


def plain(x: Any, depth: int = 0) -> Any:
    """An answer as plain data: bodies parsed as JSON when they are, tensors as numpy arrays."""
    if depth > 16:
        return repr(type(x))
    if isinstance(x, (bytes, bytearray, memoryview)):
        try:
            return orjson.loads(x)
        except orjson.JSONDecodeError:
            return bytes(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    mod = type(x).__module__
    if mod.startswith("torch") and hasattr(x, "detach"):
        import numpy as np

        t = x.detach().cpu()
        return np.asarray(t.float() if t.dtype.is_floating_point and t.dtype.itemsize < 4 else t)
    if mod.startswith("numpy"):
        return x
    if isinstance(x, dict):
        return {str(k): plain(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v, depth + 1) for v in x]
    body = getattr(x, "body", None)  # a Starlette/FastAPI Response returned by a handler
    if isinstance(body, (bytes, bytearray)):
        return plain(body, depth + 1)
    dump = getattr(x, "model_dump", None)  # pydantic
    if callable(dump):
        return plain(dump(), depth + 1)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return plain(dataclasses.asdict(x), depth + 1)
    return repr(type(x))


def _is_array(x: Any) -> bool:
    return type(x).__module__.startswith("numpy") and hasattr(x, "shape")


def close(a: Any, b: Any) -> tuple[bool, bool]:
    """(equal within float noise, exactly equal)."""
    if _is_array(a) or _is_array(b):
        import numpy as np

        try:
            x, y = np.asarray(a), np.asarray(b)
            if x.shape != y.shape:
                return False, False
            if x.dtype.kind in "fc" or y.dtype.kind in "fc":
                exact = bool(np.array_equal(x, y, equal_nan=True))
                return exact or bool(np.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True)), exact
            same = bool(np.array_equal(x, y))
            return same, same
        except (TypeError, ValueError):
            return False, False
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b, a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
            return True, True
        return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL), False
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False, False
        return _all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False, False
        return _all(close(x, y) for x, y in zip(a, b))
    return a == b, a == b


def _all(pairs: Any) -> tuple[bool, bool]:
    exact = True
    for ok, ex in pairs:
        if not ok:
            return False, False
        exact = exact and ex
    return True, exact


def shape(x: Any, depth: int = 0) -> Any:
    """The structure of an answer: keys, lengths, array shapes, scalar types."""
    if depth > 16:
        return "..."
    if _is_array(x):
        return ("array", tuple(x.shape))
    if isinstance(x, dict):
        return {k: shape(v, depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return ("list", len(x), shape(x[0], depth + 1) if x else None)
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, (int, float)):
        return "number"
    return type(x).__name__


class Answers:
    """The answers of one experiment: the unchanged endpoint's (A) and the fix's (B)."""

    def __init__(self, *, same: bool = True) -> None:
        self.same = same
        self.reference: Any = None
        self.seen = False
        self.base_varies = False
        self.differ = 0  # fix's answers unlike the reference
        self.shape_differ = 0  # ... even in their structure
        self.inexact = False
        self.first_difference = ""

    def add(self, answer: Any, *, fixed: bool) -> None:
        value = plain(answer)
        if not self.seen:
            self.reference, self.seen = value, True
            return
        ok, exact = close(self.reference, value)
        if not fixed:
            self.base_varies = self.base_varies or not ok
            return
        if not ok:
            self.differ += 1
            self.shape_differ += shape(self.reference) != shape(value)
            if not self.first_difference:
                self.first_difference = _describe(self.reference, value)
        elif not exact:
            self.inexact = True

    def verdict(self) -> str:
        """How the fix's answers compared; raises ``Abandon`` when they differ and must not."""
        from .lab import Abandon

        if self.base_varies and self.shape_differ and self.same:
            raise Abandon(f"the answers changed with the fix ({self.first_difference}), so it is not a fix the doctor may measure")
        if self.base_varies:
            return "the endpoint's own answers vary from call to call: compared by structure only"
        if self.differ:
            if self.same:
                raise Abandon(f"the answers changed with the fix ({self.first_difference}), so it is not a fix the doctor may measure")
            return "differ"
        return "same within float noise" if self.inexact else "same"


def _describe(a: Any, b: Any) -> str:
    if shape(a) != shape(b):
        return "their structure or shape changed"
    text = orjson.dumps(b, option=orjson.OPT_SERIALIZE_NUMPY, default=repr)[:80].decode("utf-8", "replace")
    return f"for example {text}"
