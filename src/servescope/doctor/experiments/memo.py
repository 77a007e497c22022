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
import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..context import current_evidence
from ..keys import key_of

__all__ = ["Memo", "Patches", "key_of", "patching", "user_modules"]

#: (module, function, label) of the loaders that are plain functions.
LOADER_FUNCTIONS = (
    ("torch", "load", "torch.load"),
    ("torch.jit", "load", "torch.jit.load"),
    ("safetensors.torch", "load_file", "safetensors.load_file"),
    ("joblib", "load", "joblib.load"),
    ("pickle", "load", "pickle.load"),
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
def user_modules() -> list[Any]:
    """The modules of the user's own code (not the standard library, site-packages or servescope)."""
    ours = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # servescope/
    skip = tuple({os.path.dirname(os.__file__), sys.prefix, sys.base_prefix, ours})
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
        had, old = name in vars(owner), vars(owner).get(name)
        setattr(owner, name, value)  # (its undo is kept only once it is done)
        self._undo.append((lambda: setattr(owner, name, old)) if had else (lambda: delattr(owner, name)))

    def method(self, obj: Any, name: str, value: Callable[..., Any]) -> None:
        """``obj.name`` replaced for this one object: on the instance, or, for a special method
        (which Python looks up on the type: ``pipe(x)`` calls ``type(pipe).__call__``), on its
        type, for that object alone (any other instance calls the original)."""
        if not (name.startswith("__") and name.endswith("__")):
            self.set(obj, name, value)
            return
        cls = type(obj)
        original = getattr(cls, name)

        def dispatch(self_: Any, *args: Any, **kwargs: Any) -> Any:
            return value(*args, **kwargs) if self_ is obj else original(self_, *args, **kwargs)

        self.set(cls, name, dispatch)

    def rebind(self, original: Any, value: Any) -> None:
        """Also where the user's own modules hold the original (``from joblib import load``)."""
        for mod in user_modules():
            for name, v in list(vars(mod).items()):
                if v is original:
                    self.set(mod, name, value)

    def undo(self) -> None:
        """Every patch put back, the last first; one that cannot be does not stop the others."""
        failed: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as exc:  # noqa: BLE001 - the rest must still be put back
                failed = failed or exc
        if failed is not None:
            raise failed


@contextmanager
def patching() -> Iterator[Patches]:
    """Patches made in the block, all undone if the block fails part-way."""
    patches = Patches()
    try:
        yield patches
    except BaseException:
        patches.undo()
        raise


class Memo:
    """The memory of one experiment: kept across its blocks, released at its end."""

    def __init__(self, model_types: list[type], data_keys: frozenset[int] = frozenset()) -> None:
        self.model_types = model_types
        #: keys (``hash`` of a call's arguments) of loader calls that read the request's own data
        self.data_keys = data_keys
        self.cache: dict[Any, Any] = {}
        self._alive: set[int] = set()  # ids of what the memo keeps (so their ids stay theirs)
        self.hit_count = 0
        self._local = threading.local()
        self._fallback_counts: dict[Any, int] = {}
        self._lock = threading.Lock()

    # -- keys --------------------------------------------------------------------------------
    def _key(self, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's key, or None when it must run as written: an argument known only by
        identity that the memo does not keep alive (a new object per request may reuse a freed
        one's address), or a loader reading the request's own data (its key changed when the
        request did, ``data_keys``)."""
        ids: list[int] = []
        base = (label, key_of(args, ids=ids), key_of(kwargs, ids=ids))
        if any(i not in self._alive for i in ids) or hash(base[1:]) in self.data_keys:
            return None
        ev = current_evidence()
        counts = ev.setdefault("memo_counts", {}) if ev is not None else self._fallback_counts
        n = counts.get(base, 0)
        counts[base] = n + 1
        return (*base, n)

    def _keep(self, key: Any, value: Any) -> None:
        with self._lock:
            self.cache.setdefault(key, value)
            self._alive.update((id(value), id(getattr(value, "__dict__", None))))

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
                key = None
            if key is None:
                return original(*args, **kwargs)
            with memo._lock:
                if key in memo.cache:
                    memo.hit_count += 1
                    return memo.cache[key]
            out = memo._inside(lambda: original(*args, **kwargs))
            memo._keep(key, out)
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
                key = None
            if key is None:
                return original(self_, *args, **kwargs)
            with memo._lock:
                first = memo.cache.get(key)
            if first is not None and type(first) is type(self_):
                object.__setattr__(self_, "__dict__", first.__dict__)  # the same weights, the same session
                with memo._lock:
                    memo.hit_count += 1
                return None
            memo._inside(lambda: original(self_, *args, **kwargs))
            memo._keep(key, self_)
            return None

        return remembered

    def load_state_dict(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Loading a remembered state dict into a remembered module again changes nothing."""
        memo = self

        @functools.wraps(original)
        def load(self_: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            if not memo._outermost() or id(state_dict) not in memo._alive or id(self_.__dict__) not in memo._alive:
                return original(self_, state_dict, *args, **kwargs)
            key = ("load_state_dict", id(self_.__dict__), id(state_dict), key_of(args), key_of(kwargs))
            with memo._lock:
                if key in memo.cache:
                    memo.hit_count += 1
                    return memo.cache[key]
            out = memo._inside(lambda: original(self_, state_dict, *args, **kwargs))
            memo._keep(key, out)
            return out

        return load

    # -- apply -------------------------------------------------------------------------------
    def apply(self) -> Callable[[], None]:
        with patching() as patches:
            for module, name, label in LOADER_FUNCTIONS:
                mod = sys.modules.get(module)
                # (looked up in the module's own namespace: a lazy package is not made to import)
                original = vars(mod).get(name) if mod is not None else None
                if callable(original):
                    wrapped = self.function(original, label)
                    patches.set(mod, name, wrapped)
                    patches.rebind(original, wrapped)
            for cls in _pretrained_classes():
                raw = vars(cls)["from_pretrained"]
                patches.set(cls, "from_pretrained", classmethod(self.function(raw.__func__, f"{cls.__qualname__}.from_pretrained")))
            classes = [vars(sys.modules[m]).get(c) for m, c in LOADER_CLASSES if m in sys.modules]
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
            self._alive.clear()


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
