"""Loaders answered from memory: what "load once, at start-up" would do, tried on the
endpoint as it is.

While applied, the outermost call of every loader the doctor knows (``torch.load``,
``torch.jit.load``, safetensors, ``joblib.load``, ``pickle.load``, any ``from_pretrained``,
``SentenceTransformer(...)``, ``InferenceSession(...)``) and of every model class the warm
requests built (``ConvNet()``, ``nn.Linear(...)``) returns what the same call with the same
arguments returned the first time. A constructor cannot return another object, so a built
object shares the first one's ``__dict__``: the same weights, the same session. Calls are
keyed by their arguments (paths with their size and time, bytes by a sample of their
content, objects the memo itself returned by identity) and by how many times the same call
came before in the same request (two ``nn.Linear(512, 512)`` in one model are two layers).
``load_state_dict`` of a remembered state dict into a remembered module is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import sys
import threading
from typing import Any, Callable

from ..context import current_evidence

__all__ = ["Memo", "Patches", "key_of", "user_modules"]

#: (module, function, label) of the loaders that are plain functions.
LOADER_FUNCTIONS = (
    ("torch", "load", "torch.load"),
    ("torch.jit", "load", "torch.jit.load"),
    ("safetensors.torch", "load_file", "safetensors.load_file"),
    ("joblib", "load", "joblib.load"),
    ("pickle", "load", "pickle.load"),
    ("pickle", "loads", "pickle.loads"),
    ("transformers", "pipeline", "transformers.pipeline"),
)
#: packages whose classes' ``from_pretrained`` classmethods are loaders
PRETRAINED_PACKAGES = ("transformers", "sentence_transformers", "diffusers", "peft", "timm")
#: (module, class) of the loaders that are constructors
LOADER_CLASSES = (
    ("sentence_transformers", "SentenceTransformer"),
    ("sentence_transformers", "CrossEncoder"),
    ("onnxruntime", "InferenceSession"),
)
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


def key_of(x: Any, depth: int = 0) -> Any:
    """A hashable key for a loader's argument that is the same for the same content."""
    if depth > 6:
        return ("deep", id(x))
    if x is None or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, str):
        try:
            st = os.stat(x) if len(x) < 4096 and os.sep in x or os.path.exists(x) else None
        except (OSError, ValueError):
            st = None
        return (x, st.st_size, st.st_mtime_ns) if st is not None else x
    if isinstance(x, os.PathLike):
        return key_of(os.fspath(x), depth + 1)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return ("bytes", _digest(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(key_of(v, depth + 1) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((repr(k), key_of(v, depth + 1)) for k, v in x.items()), key=lambda kv: kv[0])))
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
            return ("id", id(x))
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
    return ("obj", id(d)) if isinstance(d, dict) else ("id", id(x))


def user_modules() -> list[Any]:
    """The modules of the user's own code (not the standard library, site-packages or servescope)."""
    skip = tuple({os.path.dirname(os.__file__), sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(__file__))})
    out = []
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and not f.startswith(skip) and "site-packages" not in f and "dist-packages" not in f:
            out.append(mod)
    return out


class Patches:
    """Attributes replaced for a while, and put back exactly as they were."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        if name in vars(owner):
            old = vars(owner)[name]
            self._undo.append(lambda: setattr(owner, name, old))
        else:
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, value)

    def rebind(self, original: Any, value: Any) -> None:
        """Also where the user's own modules hold the original (``from joblib import load``)."""
        for mod in user_modules():
            for name, v in list(vars(mod).items()):
                if v is original:
                    self.set(mod, name, value)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


class Memo:
    """The memory of one experiment: kept across its blocks, released at its end."""

    def __init__(self, model_types: list[type]) -> None:
        self.model_types = model_types
        self.cache: dict[Any, Any] = {}
        self.hit_count = 0
        self._local = threading.local()
        self._fallback_counts: dict[Any, int] = {}
        self._lock = threading.Lock()

    # -- keys --------------------------------------------------------------------------------
    def _key(self, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        base = (label, key_of(args), key_of(kwargs))
        ev = current_evidence()
        counts = ev.setdefault("memo_counts", {}) if ev is not None else self._fallback_counts
        n = counts.get(base, 0)
        counts[base] = n + 1
        return (*base, n)

    def _outermost(self) -> bool:
        return getattr(self._local, "depth", 0) == 0

    def _inside(self, fn: Callable[[], Any]) -> Any:
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            return fn()
        finally:
            self._local.depth -= 1

    # -- wrappers ----------------------------------------------------------------------------
    def function(self, original: Callable[..., Any], label: str) -> Callable[..., Any]:
        memo = self

        @functools.wraps(original)
        def remembered(*args: Any, **kwargs: Any) -> Any:
            if not memo._outermost():
                return original(*args, **kwargs)
            try:
                key = memo._key(label, args, kwargs)
            except Exception:  # an argument that cannot be keyed: the call as written
                return original(*args, **kwargs)
            with memo._lock:
                if key in memo.cache:
                    memo.hit_count += 1
                    return memo.cache[key]
            out = memo._inside(lambda: original(*args, **kwargs))
            with memo._lock:
                memo.cache.setdefault(key, out)
            return out

        return remembered

    def constructor(self, original: Callable[..., Any], label: str) -> Callable[..., None]:
        memo = self

        @functools.wraps(original)
        def remembered(self_: Any, *args: Any, **kwargs: Any) -> None:
            if not memo._outermost() or not isinstance(getattr(self_, "__dict__", None), dict):
                return original(self_, *args, **kwargs)
            try:
                key = memo._key(label + "." + type(self_).__qualname__, args, kwargs)
            except Exception:
                return original(self_, *args, **kwargs)
            with memo._lock:
                first = memo.cache.get(key)
            if first is not None and type(first) is type(self_):
                object.__setattr__(self_, "__dict__", first.__dict__)  # the same weights, the same session
                with memo._lock:
                    memo.hit_count += 1
                return None
            memo._inside(lambda: original(self_, *args, **kwargs))
            with memo._lock:
                memo.cache.setdefault(key, self_)
            return None

        return remembered

    def load_state_dict(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Loading a remembered state dict into a remembered module again changes nothing."""
        memo = self
        remembered_ids = lambda: {id(v) for v in memo.cache.values()}  # noqa: E731

        @functools.wraps(original)
        def load(self_: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            if not memo._outermost() or id(state_dict) not in remembered_ids():
                return original(self_, state_dict, *args, **kwargs)
            key = ("load_state_dict", id(self_.__dict__), id(state_dict), key_of(args), key_of(kwargs))
            with memo._lock:
                if key in memo.cache:
                    memo.hit_count += 1
                    return memo.cache[key]
            out = memo._inside(lambda: original(self_, state_dict, *args, **kwargs))
            with memo._lock:
                memo.cache[key] = out
            return out

        return load

    # -- apply -------------------------------------------------------------------------------
    def apply(self) -> Callable[[], None]:
        patches = Patches()
        for module, name, label in LOADER_FUNCTIONS:
            mod = sys.modules.get(module)
            original = getattr(mod, name, None) if mod is not None else None
            if callable(original):
                wrapped = self.function(original, label)
                patches.set(mod, name, wrapped)
                patches.rebind(original, wrapped)
        for cls in _pretrained_classes():
            raw = vars(cls)["from_pretrained"]
            patches.set(cls, "from_pretrained", classmethod(self.function(raw.__func__, f"{cls.__qualname__}.from_pretrained")))
        classes = [getattr(sys.modules[m], c, None) for m, c in LOADER_CLASSES if m in sys.modules]
        for cls in [c for c in classes if isinstance(c, type)] + [t for t in self.model_types if t not in classes]:
            own = vars(cls).get("__init__")
            original = own if own is not None else _inherited_init(cls)
            patches.set(cls, "__init__", self.constructor(original, cls.__module__))
        torch = sys.modules.get("torch")
        if torch is not None:
            patches.set(torch.nn.Module, "load_state_dict", self.load_state_dict(torch.nn.Module.load_state_dict))
        return patches.undo

    def hits(self) -> int:
        return self.hit_count

    def release(self) -> None:
        with self._lock:
            self.cache.clear()


def _inherited_init(cls: type) -> Callable[..., None]:
    def init(self_: Any, *args: Any, **kwargs: Any) -> None:
        super(cls, self_).__init__(*args, **kwargs)  # type: ignore[misc]

    return init


def _pretrained_classes() -> list[type]:
    """Classes of the loaded model libraries that define their own ``from_pretrained``."""
    out, seen = [], set()
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(PRETRAINED_PACKAGES):
            continue
        for v in list(vars(mod).values()):
            if isinstance(v, type) and id(v) not in seen and isinstance(vars(v).get("from_pretrained"), classmethod):
                seen.add(id(v))
                out.append(v)
    return out
