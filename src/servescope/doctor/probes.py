"""Probes: see inside the user's endpoint without changing its code.

Installed for a doctor run, removed after. Each probe opens a stage in the current trace
(so timings land in the right request, across threads and tasks) and counts what it saw in
the request's evidence (a dict in a ContextVar the doctor sets per request):

- torch's global module hooks: the outermost module call is ``infer``; its inputs give the
  batch size, devices, autograd and training flags, and whether it ran on an event loop;
- ``Tensor.to/.cuda/.cpu`` and ``Module.to``: host<->device copies (``to_device``/``to_host``),
  bytes, ``non_blocking``, pinned sources, models moved per request; ``.item/.tolist/.numpy``
  on a device tensor are sync points;
- ``torch.load``, ``load_state_dict``, safetensors, ``from_pretrained``, SentenceTransformer
  and ``nn.Module.__init__``: model loading and construction (``load``);
- ``json``/``orjson``, FastAPI's ``jsonable_encoder``, Starlette's ``JSONResponse.render``,
  Flask's JSON provider: ``serialize``; ``json.loads``, pydantic validation, FastAPI's body
  solving, Flask's ``get_json``: ``validate``.

Each wrapped call costs one stage (about a microsecond); the doctor states the total.

A probe never changes what the endpoint does: the user's call runs exactly as it would
(its result and its exceptions pass through), a probe whose own bookkeeping raises is
switched off for the rest of the run and named in ``Probes.disabled``, and no hook runs
while torch traces, scripts or compiles (``torch.jit.trace`` calls the model under a
tracer that must not see the probes' work).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Callable

from ..timing import current_stage_name, stage

__all__ = ["Probes", "current_evidence", "new_evidence", "reset_evidence", "set_evidence"]

_evidence: ContextVar[dict[str, Any] | None] = ContextVar("servescope_evidence", default=None)


def new_evidence() -> dict[str, Any]:
    return {
        "loads": 0,
        "load_calls": [],
        "constructed": 0,
        "first_init_ns": None,
        "last_init_ns": None,
        "module_moves": 0,
        "h2d": 0,
        "d2h": 0,
        "copy_bytes": 0,
        "small_copies": 0,
        "unpinned_async": 0,
        "syncs": 0,
        "forwards": [],
    }


def current_evidence() -> dict[str, Any] | None:
    return _evidence.get()


def set_evidence(ev: dict[str, Any] | None) -> Any:
    """Make ``ev`` the evidence record of the request running in this context."""
    return _evidence.set(ev)


def reset_evidence(token: Any) -> None:
    _evidence.reset(token)


class _Switch:
    """One probe's on/off state: the first exception in its own code turns it off, and the
    reason is kept for the report."""

    __slots__ = ("name", "on", "owner")

    def __init__(self, name: str, owner: Probes) -> None:
        self.name, self.on, self.owner = name, True, owner

    def fail(self, exc: BaseException) -> None:
        if self.on:
            self.on = False
            self.owner.disabled.setdefault(self.name, f"{type(exc).__name__}: {exc}"[:300])


def _loop_running() -> bool:
    return asyncio._get_running_loop() is not None


class Probes:
    """Install with ``with Probes() as probes:``; read ``probes.captured`` after."""

    SMALL_COPY = 4096  # bytes: many copies this small per request are overhead, not data

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._local = threading.local()
        self.captured: dict[str, Any] = {}  # first model and input seen: the batch probe replays it
        self._static_cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.torch: Any = None
        #: probe name -> why it was switched off (its own code raised)
        self.disabled: dict[str, str] = {}
        self._switches: dict[str, _Switch] = {}

    def switch(self, name: str) -> _Switch:
        sw = self._switches.get(name)
        if sw is None:
            sw = self._switches[name] = _Switch(name, self)
        return sw

    # -- install / remove --------------------------------------------------------------------
    def __enter__(self) -> Probes:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def install(self) -> None:
        self._wrap_module_attr("json", "dumps", "serialize")
        self._wrap_module_attr("json", "loads", "validate")
        self._wrap_module_attr("orjson", "dumps", "serialize")
        self._wrap_module_attr("orjson", "loads", "validate")
        for mod in ("fastapi.encoders", "fastapi.routing"):
            self._wrap_module_attr(mod, "jsonable_encoder", "serialize", only_if_imported=False)
        self._wrap_module_attr("fastapi.routing", "solve_dependencies", "validate", only_if_imported=False)
        self._wrap_class_attr("starlette.responses", "JSONResponse", "render", "serialize")
        self._wrap_class_attr("flask.json.provider", "DefaultJSONProvider", "dumps", "serialize")
        self._wrap_class_attr("flask.json.provider", "DefaultJSONProvider", "response", "serialize")
        self._wrap_class_attr("flask", "Request", "get_json", "validate")
        self._wrap_class_attr("pydantic", "BaseModel", "model_validate", "validate", classmethod_=True)
        self._wrap_class_attr("pydantic", "BaseModel", "model_validate_json", "validate", classmethod_=True)
        self._mark_handler_entry()
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: F811
            except ImportError:
                return
        self.torch = torch
        self._install_torch(torch)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _mark_handler_entry(self) -> None:
        """FastAPI hops to a thread pool for `def` endpoints: note when the user's function
        starts, so the hop is not taken for the user's preprocessing. Replaces FastAPI's
        ``run_endpoint_function`` (dispatch only: the same call, the same thread pool) when
        its signature is the one this was written for."""
        routing = sys.modules.get("fastapi.routing")
        if routing is None:
            try:
                import fastapi.routing as routing  # noqa: F811
            except ImportError:
                return
        original = getattr(routing, "run_endpoint_function", None)
        try:
            from starlette.concurrency import run_in_threadpool

            params = set(inspect.signature(original).parameters) if original is not None else set()
        except (ImportError, TypeError, ValueError):
            return
        if params != {"dependant", "values", "is_coroutine"}:
            return
        sw = self.switch("fastapi handler entry")

        def mark() -> None:
            if sw.on:
                try:
                    ev = _evidence.get()
                    if ev is not None:
                        ev["handler_start_ns"] = time.perf_counter_ns()
                except Exception as exc:
                    sw.fail(exc)

        def entered(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(**kwargs: Any) -> Any:
                mark()
                return fn(**kwargs)

            return run

        @functools.wraps(original)
        async def wrapper(*, dependant: Any, values: dict[str, Any], is_coroutine: bool) -> Any:
            if not sw.on:
                return await original(dependant=dependant, values=values, is_coroutine=is_coroutine)
            if is_coroutine:
                mark()
                return await dependant.call(**values)
            return await run_in_threadpool(entered(dependant.call), **values)

        routing.run_endpoint_function = wrapper
        self._undo.append(lambda: setattr(routing, "run_endpoint_function", original))

    # -- generic wrappers --------------------------------------------------------------------
    def _wrap_module_attr(self, module: str, name: str, stage_name: str, *, only_if_imported: bool = False) -> None:
        mod = sys.modules.get(module)
        if mod is None and not only_if_imported:
            try:
                mod = importlib.import_module(module)
            except ImportError:
                return
        if mod is None or not hasattr(mod, name):
            return
        original = getattr(mod, name)
        setattr(mod, name, _staged(original, stage_name, self.switch(f"{module}.{name}")))
        self._undo.append(lambda: setattr(mod, name, original))

    def _wrap_class_attr(self, module: str, cls_name: str, name: str, stage_name: str, *, classmethod_: bool = False) -> None:
        mod = sys.modules.get(module)
        if mod is None:
            try:
                mod = importlib.import_module(module)
            except ImportError:
                return
        cls = getattr(mod, cls_name, None)
        if cls is None or name not in cls.__dict__:
            return
        raw = cls.__dict__[name]
        sw = self.switch(f"{module}.{cls_name}.{name}")
        if classmethod_ and isinstance(raw, classmethod):
            wrapped: Any = classmethod(_staged(raw.__func__, stage_name, sw))
        else:
            wrapped = _staged(raw, stage_name, sw)
        setattr(cls, name, wrapped)
        self._undo.append(lambda: setattr(cls, name, raw))

    # -- torch -------------------------------------------------------------------------------
    def _install_torch(self, torch: Any) -> None:
        local = self._local
        infer = stage("infer")
        probes = self
        sw = self.switch("torch module hooks")
        busy = _torch_busy(torch)

        def pre_hook(module: Any, args: tuple[Any, ...]) -> None:
            depth = getattr(local, "depth", 0) + 1
            local.depth = depth
            if not sw.on or getattr(local, "active", None) is not None or busy():
                return  # inside an outer forward, or torch is tracing/scripting/compiling
            try:
                ev = _evidence.get()
                if ev is not None:
                    ev["forwards"].append(probes._describe(module, args))
                if "model" not in probes.captured and args and not _is_script(torch, module):
                    captured = _capture(torch, args[0])
                    if captured is not None:
                        probes.captured["model"] = module
                        probes.captured["input"] = captured
                infer.__enter__()
            except Exception as exc:
                sw.fail(exc)
                return
            local.active = depth
            local.t0 = time.perf_counter_ns()

        def post_hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
            depth = getattr(local, "depth", 1)
            local.depth = depth - 1
            if getattr(local, "active", None) != depth:
                return
            local.active = None
            try:
                ev = _evidence.get()
                if ev is not None and ev["forwards"]:
                    ev["forwards"][-1]["ms"] = (time.perf_counter_ns() - local.t0) / 1e6
            except Exception as exc:
                sw.fail(exc)
            infer.__exit__(None, None, None)

        h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
        h2 = torch.nn.modules.module.register_module_forward_hook(post_hook, always_call=True)
        self._undo.append(h1.remove)
        self._undo.append(h2.remove)
        self._patch(torch.Tensor, "to", self._tensor_copy(torch, torch.Tensor.to, is_to=True))
        self._patch(torch.Tensor, "cuda", self._tensor_copy(torch, torch.Tensor.cuda))
        self._patch(torch.Tensor, "cpu", self._tensor_copy(torch, torch.Tensor.cpu))
        for name in ("item", "tolist", "numpy"):
            self._patch(torch.Tensor, name, self._sync_point(getattr(torch.Tensor, name)))
        self._patch(torch.nn.Module, "to", self._module_move(torch.nn.Module.to))
        self._patch(torch.nn.Module, "cuda", self._module_move(torch.nn.Module.cuda))
        self._patch(torch.nn.Module, "__init__", self._module_init(torch.nn.Module.__init__))
        self._patch(torch.nn.Module, "load_state_dict", self._loader(torch.nn.Module.load_state_dict, "load_state_dict"))
        self._patch_module_func(torch, "load", "torch.load")
        for module, name, label in (
            ("safetensors.torch", "load_file", "safetensors.load_file"),
            ("torch.jit", "load", "torch.jit.load"),
        ):
            mod = sys.modules.get(module)
            if mod is not None:
                self._patch_module_func(mod, name, label)
        tr = sys.modules.get("transformers")
        if tr is not None and hasattr(tr, "PreTrainedModel"):
            fp = tr.PreTrainedModel.__dict__.get("from_pretrained")
            if isinstance(fp, classmethod):
                self._patch(tr.PreTrainedModel, "from_pretrained", classmethod(self._loader(fp.__func__, "from_pretrained")))
        st = sys.modules.get("sentence_transformers")
        if st is not None and hasattr(st, "SentenceTransformer"):
            self._patch(st.SentenceTransformer, "__init__", self._loader(st.SentenceTransformer.__init__, "SentenceTransformer()"))

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        if name in owner.__dict__:
            original = owner.__dict__[name]
            self._undo.append(lambda: setattr(owner, name, original))
        else:  # inherited (tensor methods live on the C base): remove our override after
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, value)

    def _patch_module_func(self, module: Any, name: str, label: str) -> None:
        self._patch(module, name, self._loader(getattr(module, name), label))

    def _describe(self, module: Any, args: tuple[Any, ...]) -> dict[str, Any]:
        torch = self.torch
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if x is None and args and isinstance(args[0], Mapping):  # tokenizer output: a dict of tensors
            x = next((v for v in args[0].values() if isinstance(v, torch.Tensor)), None)
        return {
            **self._static(module),
            "batch": int(x.shape[0]) if x is not None and x.dim() > 0 else None,
            "input_device": str(x.device) if x is not None else None,
            "grad": torch.is_grad_enabled() and not torch.is_inference_mode_enabled(),
            "on_event_loop": _loop_running(),
        }

    def _static(self, module: Any) -> dict[str, Any]:
        """What walking the module tree tells (class, device, training flags), cached per
        module and re-read when its own training flag or first parameter's device changes:
        walking a 100-module model on every request would distort what it measures.
        Scripted and frozen modules may lack ``training``: read as not training."""
        param = next(module.parameters(), None)
        key = (id(module), getattr(module, "training", None), None if param is None else param.device)
        cached = self._static_cache.get(key)
        if cached is None:
            torch = self.torch
            training = [m for m in module.modules() if getattr(m, "training", False) is True]
            behaves = (torch.nn.Dropout, torch.nn.modules.batchnorm._BatchNorm)
            cached = self._static_cache[key] = {
                "module": type(module).__name__,
                "param_device": str(param.device) if param is not None else None,
                "training": bool(training),
                "training_changes_output": any(isinstance(m, behaves) for m in training),
            }
        return cached

    def _tensor_copy(self, torch: Any, original: Callable[..., Any], *, is_to: bool = False) -> Callable[..., Any]:
        to_device, to_host = stage("to_device"), stage("to_host")
        sw = self.switch(f"Tensor.{original.__name__}")

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if not sw.on or (is_to and (not args or isinstance(args[0], torch.dtype)) and "device" not in kwargs):
                return original(self_, *args, **kwargs)  # a dtype change: no copy between devices
            try:
                src = self_.device.type
                ev = _evidence.get()
                # which way? timed as to_host from a device, to_device from the host (a
                # same-device .to() is a cheap no-op)
                st = to_host if src != "cpu" else to_device
            except Exception as exc:
                sw.fail(exc)
                return original(self_, *args, **kwargs)
            with st:
                out = original(self_, *args, **kwargs)
            try:
                if ev is not None and isinstance(out, torch.Tensor) and out.device.type != src:
                    nbytes = self_.numel() * self_.element_size()
                    ev["copy_bytes"] += nbytes
                    if nbytes <= Probes.SMALL_COPY:
                        ev["small_copies"] += 1
                    if src == "cpu":
                        ev["h2d"] += 1
                        if kwargs.get("non_blocking") and not _pinned(self_):
                            ev["unpinned_async"] += 1
                    else:
                        ev["d2h"] += 1
                        ev["syncs"] += 1
            except Exception as exc:
                sw.fail(exc)
            return out

        return wrapper

    def _sync_point(self, original: Callable[..., Any]) -> Callable[..., Any]:
        sw = self.switch(f"Tensor.{original.__name__}")

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if sw.on:
                try:
                    if self_.device.type not in ("cpu", "meta"):
                        ev = _evidence.get()
                        if ev is not None:
                            ev["syncs"] += 1
                except Exception as exc:
                    sw.fail(exc)
            return original(self_, *args, **kwargs)

        return wrapper

    def _module_move(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Module.to/.cuda``: a move counts when a parameter's device changed (a ``.to("cpu")``
        of a model already there moves nothing)."""
        to_device = stage("to_device")
        sw = self.switch(f"Module.{original.__name__}")

        def device_of(module: Any) -> Any:
            p = next(module.parameters(), None)
            return None if p is None else p.device

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if not sw.on:
                return original(self_, *args, **kwargs)
            try:
                ev, before = _evidence.get(), device_of(self_)
            except Exception as exc:
                sw.fail(exc)
                return original(self_, *args, **kwargs)
            with to_device:
                out = original(self_, *args, **kwargs)
            try:
                if ev is not None and device_of(self_) != before:
                    ev["module_moves"] += 1
            except Exception as exc:
                sw.fail(exc)
            return out

        return wrapper

    def _module_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        sw = self.switch("Module.__init__")

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> None:
            if sw.on:
                try:
                    ev = _evidence.get()
                    if ev is not None:
                        now = time.perf_counter_ns()
                        ev["constructed"] += 1
                        if ev["first_init_ns"] is None:
                            ev["first_init_ns"] = now
                        ev["last_init_ns"] = now
                except Exception as exc:
                    sw.fail(exc)
            original(self_, *args, **kwargs)

        return wrapper

    def _loader(self, original: Callable[..., Any], label: str) -> Callable[..., Any]:
        load = stage("load")
        sw = self.switch(label)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not sw.on:
                return original(*args, **kwargs)
            ev = _evidence.get()
            t0 = time.perf_counter_ns()
            with load:
                try:
                    return original(*args, **kwargs)
                finally:
                    if ev is not None:
                        ev["loads"] += 1
                        ev["load_calls"].append((label, (time.perf_counter_ns() - t0) / 1e6))

        return wrapper


def _torch_busy(torch: Any) -> Callable[[], bool]:
    """A check for "torch is tracing, scripting or compiling right now": no hook may run then."""
    checks = [torch.jit.is_tracing]
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        checks.append(compiler.is_compiling)

    def busy() -> bool:
        return any(c() for c in checks)

    return busy


def _is_script(torch: Any, module: Any) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def _capture(torch: Any, x: Any) -> Any:
    """A detached copy of a model input the batch probe can replay: a tensor with a batch
    dimension, or a dict of them (what tokenizers return)."""
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        return x.detach().clone()
    if isinstance(x, Mapping):  # dict, or transformers' BatchEncoding (a UserDict)
        tensors = {k: v for k, v in x.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        if tensors and len({v.shape[0] for v in tensors.values()}) == 1:
            return {k: (v.detach().clone() if k in tensors else v) for k, v in x.items()}
    return None


def _pinned(t: Any) -> bool:
    try:
        return bool(t.is_pinned())
    except Exception:  # meta tensors, no CUDA runtime: not pinned
        return False


def _staged(fn: Callable[..., Any], stage_name: str, sw: _Switch) -> Callable[..., Any]:
    """``fn`` timed as a stage; a call made inside the same stage (recursion, as in FastAPI's
    jsonable_encoder walking every element) goes straight through, so the probe costs one
    stage per outermost call, not one per element."""
    st = stage(stage_name)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            current = current_stage_name()
            if not sw.on or current is None or current == stage_name:
                return await fn(*args, **kwargs)
            with st:
                return await fn(*args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        current = current_stage_name()
        if not sw.on or current is None or current == stage_name:
            return fn(*args, **kwargs)
        with st:
            return fn(*args, **kwargs)

    return wrapper
