"""Keys for a call's arguments that are the same for the same content: a path with its size
and time, bytes and buffers by a sample of their content, classes, modules and functions by name, objects by value
where they compare by value and by identity otherwise. The probes key each loader call with them (is it the
same call every request, or does it read the request's own data?), and the memo answers a
call from memory by them (experiments/memo.py)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import types
from typing import Any

__all__ = ["key_of"]

_SLICES, _SLICE = 32, 2048


def _digest(data: Any) -> str:
    """Big bytes by their length and a sample (32 slices of 2 KiB, spread over them: tens of
    microseconds, where hashing a 100 MB checkpoint whole would cost more than loading it)."""
    with memoryview(data) as raw:
        view = raw.cast("B")
        h = hashlib.blake2b(digest_size=12)
        n = len(view)
        if n <= _SLICES * _SLICE:
            h.update(view)
        else:
            for i in range(_SLICES):
                at = (n - _SLICE) * i // (_SLICES - 1)
                h.update(view[at : at + _SLICE])
        view.release()
    return f"{n}:{h.hexdigest()}"


def key_of(x: Any, depth: int = 0, ids: list[int] | None = None) -> Any:
    """A hashable key for a loader's argument that is the same for the same content. Objects
    keyed by identity put their id in ``ids`` (when given): an id is only the same object
    while that object lives, so whoever compares keys must know it does."""
    if depth > 6:
        if ids is not None:
            ids.append(id(x))
        return ("deep", id(x))
    if x is None or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, str):
        try:  # a path: its size and time too (a file rewritten is another model)
            st = os.stat(x) if len(x) < 4096 and (os.sep in x or os.path.exists(x)) else None
        except (OSError, ValueError):
            st = None
        return (x, st.st_size, st.st_mtime_ns) if st is not None else x
    if isinstance(x, os.PathLike):
        return key_of(os.fspath(x), depth + 1, ids)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return ("bytes", _digest(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(key_of(v, depth + 1, ids) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((repr(k), key_of(v, depth + 1, ids)) for k, v in x.items()), key=lambda kv: kv[0])))
    if isinstance(x, io.BytesIO):
        buf = x.getbuffer()
        try:
            return ("BytesIO", x.tell(), _digest(buf))
        finally:
            buf.release()  # (an export left open would stop the buffer from growing)
    if hasattr(x, "read") and isinstance(getattr(x, "name", None), str):  # an open file
        try:
            return ("file", key_of(x.name, depth + 1), x.tell())
        except (OSError, ValueError):
            pass
    if isinstance(x, types.MethodType):  # a bound method: its function and its object
        return ("method", key_of(x.__func__, depth + 1, ids), key_of(x.__self__, depth + 1, ids))
    if isinstance(x, types.ModuleType):
        return ("module", x.__name__)
    if isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType)) and _named(x):
        # a class or function its module names (``AutoTokenizer``, the first argument of
        # ``AutoTokenizer.from_pretrained``) lives as long as the program: by its name, with no
        # need to be kept; a lambda, a closure or a class made per request is known by identity
        return ("def", x.__module__, x.__qualname__)
    mod = type(x).__module__
    if mod.startswith("torch") and type(x).__name__ in ("device", "dtype"):
        return str(x)
    cls = type(x)
    if cls.__hash__ is not None and cls.__hash__ is not object.__hash__ and cls.__eq__ is not object.__eq__:
        try:
            hash(x)
            return ("eq", x)
        except TypeError:
            pass
    d = getattr(x, "__dict__", None)
    if ids is not None:
        ids.append(id(d) if isinstance(d, dict) else id(x))
    return ("obj", id(d)) if isinstance(d, dict) else ("id", id(x))


def _named(x: Any) -> bool:
    """Whether ``x`` is what its module's namespace names by its qualified name."""
    mod, qualname = getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qualname, str) or "<" in qualname:
        return False
    obj: Any = sys.modules.get(mod)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is x
