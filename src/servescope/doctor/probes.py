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

import functools
import importlib
import inspect
import sys
import threading
import time
import weakref
from typing import Any, Callable

from ..timing import current_stage_name, stage
from .inputs import decode_step, detached, fingerprint, first_array, number_rows, pad_share, replicate, text_batch
from .context import _in_model_call, _loop_running, current_evidence, new_evidence, reset_evidence, set_evidence
from .keys import key_of
from .late import ImportWatch
from .stacks import LATE_LIBRARIES, StackProbes
from .transfers import TorchCallProbes

__all__ = ["Probes", "current_evidence", "new_evidence", "reset_evidence", "set_evidence"]

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


class Probes(StackProbes, TorchCallProbes):
    """Install with ``with Probes() as probes:``; read ``probes.captured`` after."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._local = threading.local()
        self.captured: dict[str, Any] = {}  # "calls": fingerprint -> a model call the batch probe replays
        self._static_cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.torch: Any = None
        #: probe name -> why it was switched off (its own code raised)
        self.disabled: dict[str, str] = {}
        self._switches: dict[str, _Switch] = {}
        #: model calls seen outside any request's context (a batcher's thread, an executor)
        self.background_forwards: list[dict[str, Any]] = []
        #: intra-op threads of each ONNX Runtime session created while probed
        self.ort_threads: list[int] = []
        #: model classes built inside requests (``nn.Module`` subclasses), with how many times
        self.model_types: dict[type, int] = {}
        #: input fingerprint -> (the object called, its method, how its inputs are read), for the
        #: experiments that change one model call (weakly held: a model built per request goes)
        self.owners: dict[str, tuple[Any, str, Callable[[tuple[Any, ...], dict[str, Any]], Any]]] = {}
        #: the outermost torch modules called in requests, by id (weakly held)
        self.modules: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._has_params: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._patched: set[tuple[int, str]] = set()
        self._lock = threading.RLock()  # (a late import inside a late import takes it again)

    #: distinct model calls kept for the batch probe (the first few, by input fingerprint)
    MAX_CAPTURED = 8

    def wants(self, fp: str | None) -> bool:
        calls = self.captured.setdefault("calls", {})
        return fp not in calls and len(calls) < self.MAX_CAPTURED

    def capture(self, fp: str | None, replay: Callable[[int], Callable[[], Any]], kind: str, model: Any) -> None:
        """Keep a model call the batch probe can replay at other batch sizes."""
        with self._lock:
            self.captured.setdefault("calls", {}).setdefault(fp, {"replay": replay, "kind": kind, "model": model})

    MAX_OWNERS = 64

    def own(self, fp: str | None, owner: Any, method: str, inputs_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
        """Remember which object a model call with this input fingerprint went to."""
        if fp is None or fp in self.owners or len(self.owners) >= self.MAX_OWNERS:
            return
        try:
            ref = weakref.ref(owner)
        except TypeError:  # an object without weak references: not kept
            return
        with self._lock:
            self.owners.setdefault(fp, (ref, method, inputs_of))

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
        self._install_stacks()
        watch = ImportWatch(LATE_LIBRARIES, self._install_late, exact=("torch",))
        watch.start()
        self._undo.append(watch.stop)
        # torch only where the endpoint has it: imported here, it would be in a process that
        # never had it (a scikit-learn forest's 40 calls ran 10% slower beside an imported torch)
        if "torch" in sys.modules:
            self._with_torch(sys.modules["torch"])

    def _with_torch(self, torch: Any) -> None:
        self.torch = torch
        self._install_torch(torch)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()
        self._patched.clear()

    def _install_late(self, name: str) -> None:
        """A model library imported after the probes were installed (inside a request): its
        probes attach now, before its first call."""
        with self._lock:
            if name == "torch":
                self._with_torch(sys.modules["torch"])
            else:
                self._install_stacks()

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
                    ev = current_evidence()
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
        """The outermost ``nn.Module`` call is ``infer``. The pre-hook (positional arguments
        only, in torch's global hooks) opens the stage; the post-hook, which torch gives the
        keyword arguments too, describes the call (``model(**inputs)`` is the common shape)."""
        local = self._local
        infer = stage("infer")
        probes = self
        sw = self.switch("torch module hooks")
        busy = _torch_busy(torch)

        def pre_hook(module: Any, args: tuple[Any, ...]) -> None:
            depth = getattr(local, "depth", 0) + 1
            local.depth = depth
            if not sw.on or getattr(local, "active", None) is not None or busy() or _in_model_call.get():
                return  # inside an outer forward or another model call (encode, a pipeline), or torch is tracing
            try:
                if not probes._weights(module):
                    return  # a module without weights (an image transform, a softmax) prepares or reads, it is no model
            except Exception as exc:
                sw.fail(exc)
                return
            try:
                infer.__enter__()
            except Exception as exc:
                sw.fail(exc)
                return
            local.active = depth
            local.t0 = time.perf_counter_ns()

        def post_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            depth = getattr(local, "depth", 1)
            local.depth = depth - 1
            if getattr(local, "active", None) != depth:
                return
            local.active = None
            ms = (time.perf_counter_ns() - local.t0) / 1e6
            try:
                record = {**probes._static(module), **probes._describe_call((args, kwargs), ms)}
                probes._record_forward(record)
                if current_evidence() is not None:
                    probes.modules[id(module)] = module
                    probes.own(record["fp"], module, "forward", _args_and_kwargs)
                if probes.wants(record["fp"]) and not _is_script(torch, module) and first_array((args, kwargs)) is not None:
                    with torch.inference_mode(False):  # copies the probe can also run with autograd on
                        cargs, ckwargs = detached(args), detached(kwargs)

                    def replay(b: int) -> Callable[[], Any]:
                        a, k = replicate(cargs, b), replicate(ckwargs, b)
                        return lambda: module(*a, **k)

                    probes.capture(record["fp"], replay, "torch", module)
            except Exception as exc:
                sw.fail(exc)
            infer.__exit__(None, None, None)

        h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
        h2 = torch.nn.modules.module.register_module_forward_hook(post_hook, with_kwargs=True, always_call=True)
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
        raw_new = torch.nn.Parameter.__dict__.get("__new__")
        if isinstance(raw_new, staticmethod):
            self._patch(torch.nn.Parameter, "__new__", staticmethod(self._param_new(raw_new.__func__)))
        self._patch(torch.nn.Module, "load_state_dict", self._loader(torch.nn.Module.load_state_dict, "load_state_dict"))
        self._patch_module_func(torch, "load", "torch.load")
        self._patch_module_func(torch.jit, "load", "torch.jit.load")
        safetensors = sys.modules.get("safetensors.torch")
        if safetensors is not None:
            self._patch_module_func(safetensors, "load_file", "safetensors.load_file")

    def _weights(self, module: Any) -> bool:
        """Whether a module has parameters (cached: asked on every outermost call)."""
        has = self._has_params.get(module)
        if has is None:
            has = self._has_params[module] = next(module.parameters(), None) is not None
        return has

    def _describe_call(self, inputs: Any, ms: float) -> dict[str, Any]:
        """What a model call's inputs tell, whatever their shape: batch size, device, padding,
        a fingerprint; and the call's context (autograd, event loop)."""
        torch = self.torch
        x = first_array(inputs)
        device = getattr(x, "device", None)
        texts = text_batch(inputs) if x is None else None
        if x is None and texts is None:
            rows = number_rows(inputs)  # model.predict([features]): rows as nested lists
            texts = len(rows) if rows is not None else None
        seq, cached = decode_step(inputs)
        return {
            "seq": seq,
            "cached": cached,
            "batch": int(x.shape[0]) if x is not None and len(x.shape) > 0 else texts,
            "input_device": str(device) if device is not None else ("cpu" if x is not None else None),
            "grad": bool(torch is not None and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()),
            "on_event_loop": _loop_running(),
            "pad_share": pad_share(inputs),
            "fp": fingerprint(inputs),
            "ms": ms,
        }

    def _record_forward(self, record: dict[str, Any]) -> None:
        ev = current_evidence()
        if ev is not None:
            ev["forwards"].append(record)
        else:  # a batcher's worker thread, an executor without the request's context
            with self._lock:
                self.background_forwards.append({"batch": record.get("batch"), "module": record.get("module")})

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        key = (id(owner), name)
        if key in self._patched:  # (a library imported late: what was patched before stays as it is)
            return
        self._patched.add(key)
        if name in owner.__dict__:
            original = owner.__dict__[name]
            self._undo.append(lambda: setattr(owner, name, original))
        else:  # inherited (tensor methods live on the C base): remove our override after
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, value)

    def _patch_module_func(self, module: Any, name: str, label: str) -> None:
        self._patch(module, name, self._loader(getattr(module, name), label))

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

    def _loader(self, original: Callable[..., Any], label: str) -> Callable[..., Any]:
        """A loader, timed as ``load``; one inside another (``SentenceTransformer()`` calls
        ``from_pretrained``, which calls ``torch.load``) is part of the outer one, not counted
        again."""
        load = stage("load")
        sw = self.switch(label)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not sw.on or current_stage_name() == "load":
                return original(*args, **kwargs)
            ev = current_evidence()
            key = load_key(args, kwargs) if ev is not None else None  # (before it reads a file it is given)
            t0 = time.perf_counter_ns()
            with load:
                try:
                    return original(*args, **kwargs)
                finally:
                    if ev is not None:
                        t1 = time.perf_counter_ns()
                        ev["loads"] += 1
                        ev["load_calls"].append((label, (t1 - t0) / 1e6))
                        ev["load_windows"].append((t0, t1))
                        ev["load_keys"].append(key)

        return wrapper


def load_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """A loader call's key, the same for the same arguments (a path, the same bytes): a call
    whose key changes when the request does reads the request's own data, not a model. (The
    memo keys its calls the same way, experiments/memo.py.)"""
    try:
        return hash((key_of(args), key_of(kwargs)))
    except Exception:  # an argument that cannot be keyed
        return None


def _args_and_kwargs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return (args, kwargs)


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


def _staged(fn: Callable[..., Any], stage_name: str, sw: _Switch) -> Callable[..., Any]:
    """``fn`` timed as a stage when no stage is open: a call made inside any stage goes
    straight through. So recursion (FastAPI's jsonable_encoder walking every element) costs
    one stage per outermost call, and a ``json.loads`` inside a loader (a tokenizer reading
    its files) stays ``load``, inside a user's own stage stays the user's, never ``validate``."""
    st = stage(stage_name)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            current = current_stage_name()
            if not sw.on or current != "":
                return await fn(*args, **kwargs)
            with st:
                return await fn(*args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        current = current_stage_name()
        if not sw.on or current != "":
            return fn(*args, **kwargs)
        with st:
            return fn(*args, **kwargs)

    return wrapper
