"""Probes for model calls and loaders beyond ``torch.nn.Module``: ONNX Runtime,
scikit-learn, sentence-transformers' ``encode``, transformers' pipelines, tokenizers and
configs, joblib and pickle; and the hand-off of work to thread pools. A mixin of ``Probes``
(probes.py), which owns the patching, the switches and the captured calls."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from ..timing import carried, current_stage_name, stage
from .context import _evidence, _in_model_call, current_evidence
from .inputs import detached, is_frame, replicate

__all__ = ["LATE_LIBRARIES", "StackProbes"]

#: Modules whose import, when it comes after the probes were installed, attaches their probes
#: (doctor/late.py): an endpoint may import its model library inside the handler.
LATE_LIBRARIES = ("sklearn", "onnxruntime", "sentence_transformers", "transformers.", "joblib", "safetensors", "xgboost", "lightgbm")
#: Gradient-boosting libraries' own model classes (beside their scikit-learn estimators, probed
#: as scikit-learn's): the loader and the calls of each, by module and class.
_BOOSTERS = (
    ("xgboost.core", "Booster", "xgboost", ("predict", "inplace_predict"), "load_model", "xgboost.Booster.load_model"),
    ("lightgbm.basic", "Booster", "lightgbm", ("predict",), "__init__", "lightgbm.Booster()"),
)
#: Where transformers defines the classes whose loaders and calls are probed (looked up there,
#: not on the lazy top-level package, which would import them all).
_TRANSFORMERS = (
    ("transformers.modeling_utils", "PreTrainedModel", "from_pretrained"),
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase", "AutoTokenizer.from_pretrained"),
    ("transformers.configuration_utils", "PretrainedConfig", "AutoConfig.from_pretrained"),
    ("transformers.processing_utils", "ProcessorMixin", "AutoProcessor.from_pretrained"),
    ("transformers.image_processing_base", "ImageProcessingMixin", "AutoImageProcessor.from_pretrained"),
    ("transformers.feature_extraction_utils", "FeatureExtractionMixin", "AutoFeatureExtractor.from_pretrained"),
)


def _in_this_request(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` run inside the current request's trace and evidence wherever it is called (an
    executor's thread, a thread of its own); None outside a request."""
    ev = current_evidence()
    if ev is None:
        return None
    inner = carried(fn)

    def with_evidence(*a: Any, **k: Any) -> Any:
        token = _evidence.set(ev)
        try:
            return inner(*a, **k)
        finally:
            _evidence.reset(token)

    return with_evidence


class StackProbes:
    """The methods of ``Probes`` that patch libraries other than torch."""

    _patch: Callable[..., None]
    _patched: set[tuple[int, str]]
    _loader: Callable[..., Callable[..., Any]]
    _patch_module_func: Callable[..., None]
    switch: Callable[..., Any]
    _describe_call: Callable[..., dict[str, Any]]
    _record_forward: Callable[..., None]
    wants: Callable[..., bool]
    capture: Callable[..., None]
    captured: dict[str, Any]
    ort_threads: list[int]
    own: Callable[..., None]

    def _install_stacks(self) -> None:
        """Model calls and loaders beyond ``nn.Module``: ONNX Runtime, scikit-learn,
        sentence-transformers' ``encode``, transformers' pipelines, tokenizers and configs,
        joblib and pickle. Each is patched only where its package is already imported; a
        package imported later calls this again (``LATE_LIBRARIES``), and what is patched
        already stays as it is."""
        ort = sys.modules.get("onnxruntime")
        if ort is not None and hasattr(ort, "InferenceSession"):
            self._patch(ort.InferenceSession, "__init__", self._loader(self._ort_threads(ort.InferenceSession.__init__), "onnxruntime.InferenceSession()"))
            self._patch(ort.InferenceSession, "run", self._model_call(ort.InferenceSession.run, "onnxruntime", _ort_inputs, _ort_replay))
        sk = sys.modules.get("sklearn.base")
        if sk is not None and hasattr(sk, "BaseEstimator"):
            for cls in _subclasses(sk.BaseEstimator):
                for name in ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform"):
                    attr = cls.__dict__.get(name)
                    wrap = self._model_call
                    if callable(attr):
                        self._patch(cls, name, wrap(attr, "scikit-learn", _first_arg, _first_arg_replay(name)))
                    elif callable(getattr(attr, "fn", None)):  # sklearn's available_if descriptor (Pipeline)
                        self._patch(attr, "fn", wrap(attr.fn, "scikit-learn", _first_arg, _first_arg_replay(name)))
        self._install_boosters()
        st = sys.modules.get("sentence_transformers")
        if st is not None and hasattr(st, "SentenceTransformer"):
            cls = st.SentenceTransformer
            self._patch(cls, "__init__", self._loader(cls.__init__, "SentenceTransformer()"))
            self._patch(cls, "encode", self._model_call(cls.encode, "sentence-transformers", _first_arg, _first_arg_replay("encode")))
        for module, cls_name, label in _TRANSFORMERS:
            cls = getattr(sys.modules.get(module), cls_name, None)
            fp = cls.__dict__.get("from_pretrained") if cls is not None else None
            if isinstance(fp, classmethod):
                self._patch(cls, "from_pretrained", classmethod(self._loader(fp.__func__, label)))
        tok = getattr(sys.modules.get("transformers.tokenization_utils_base"), "PreTrainedTokenizerBase", None)
        if tok is not None and "decode" in tok.__dict__:
            self._patch(tok, "decode", self._decode(tok.decode))
        pipe = getattr(sys.modules.get("transformers.pipelines.base"), "Pipeline", None)
        if pipe is not None and "__call__" in pipe.__dict__:
            self._patch(pipe, "__call__", self._model_call(pipe.__call__, "transformers.pipeline", _first_arg, None))
        self._carry_into_executors()
        self._carry_into_threads()
        for module, name, label in (("joblib", "load", "joblib.load"), ("pickle", "load", "pickle.load"), ("safetensors.torch", "load_file", "safetensors.load_file")):
            mod = sys.modules.get(module)
            if mod is not None and hasattr(mod, name):
                self._patch_module_func(mod, name, label)

    def _ort_threads(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Note each ONNX Runtime session's intra-op threads (0: one per core, its default)."""
        probes = self

        @functools.wraps(original)
        def init(self_: Any, *args: Any, **kwargs: Any) -> None:
            original(self_, *args, **kwargs)
            try:
                probes.ort_threads.append(int(self_.get_session_options().intra_op_num_threads))
            except Exception:
                pass

        return init

    def _decode(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A tokenizer's ``decode`` called by the user's code (not by transformers' own
        streamers and ``batch_decode``): how many ids it turned into text, and its time."""
        sw = self.switch("tokenizer decode")

        @functools.wraps(original)
        def decode(self_: Any, token_ids: Any, *args: Any, **kwargs: Any) -> Any:
            ev = current_evidence() if sw.on else None
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if ev is None or caller.startswith("transformers"):
                return original(self_, token_ids, *args, **kwargs)
            t0 = time.perf_counter_ns()
            out = original(self_, token_ids, *args, **kwargs)
            try:
                n = len(token_ids[0]) if len(getattr(token_ids, "shape", ())) == 2 else len(token_ids)
                ev.setdefault("decodes", []).append((int(n), (time.perf_counter_ns() - t0) / 1e6))
            except Exception as exc:  # noqa: BLE001 - ids of a shape it cannot count: the probe stops, the call stands
                sw.fail(exc)
            return out

        return decode

    def _carry_into_executors(self) -> None:
        """Work handed to a thread pool from inside a request (``loop.run_in_executor``, a
        batcher's ``executor.submit``) copies no context: carry the request's trace and
        evidence along, so its model calls are seen and credited to that request. Only
        servescope's own context goes; the user's functions run as they would."""
        from concurrent.futures import ThreadPoolExecutor

        original = ThreadPoolExecutor.submit
        sw = self.switch("executor hand-off")

        @functools.wraps(original)
        def submit(self_: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            if sw.on:
                try:
                    wrapped = _in_this_request(fn)
                    if wrapped is not None:
                        return original(self_, wrapped, *args, **kwargs)
                except Exception as exc:
                    sw.fail(exc)
            return original(self_, fn, *args, **kwargs)

        self._patch(ThreadPoolExecutor, "submit", submit)

    def _carry_into_threads(self) -> None:
        """A thread started from inside a request (``Thread(target=model.generate).start()``
        beside a ``TextIteratorStreamer``) copies no context either: it runs inside the
        request's trace and evidence, so the forwards it makes are that request's. A thread
        that outlives its request records nothing more (a finished trace takes no stages)."""
        original = threading.Thread.start
        sw = self.switch("thread hand-off")

        @functools.wraps(original)
        def start(self_: threading.Thread) -> None:
            if sw.on:
                try:
                    wrapped = _in_this_request(self_.run)
                    if wrapped is not None:
                        self_.run = wrapped  # type: ignore[method-assign]
                except Exception as exc:
                    sw.fail(exc)
            return original(self_)

        self._patch(threading.Thread, "start", start)

    def _install_boosters(self) -> None:
        """XGBoost's and LightGBM's own ``Booster``: its loader (``load_model``, or LightGBM's
        ``Booster(model_file=...)``) and its calls on a DMatrix or an array."""
        for module, cls_name, kind, calls, loader, label in _BOOSTERS:
            cls = getattr(sys.modules.get(module), cls_name, None)
            if cls is None:
                continue
            if callable(cls.__dict__.get(loader)):
                self._patch(cls, loader, self._loader(cls.__dict__[loader], label))
            for name in calls:
                if callable(cls.__dict__.get(name)):
                    self._patch(cls, name, self._model_call(cls.__dict__[name], kind, _first_arg, _first_arg_replay(name) if name != "predict" or kind != "xgboost" else None))

    def _note_call(
        self, owner: Any, method: str, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any], ms: float,
        inputs_of: Callable[[tuple[Any, ...], dict[str, Any]], Any], replay_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None, sw: Any,
    ) -> None:
        """What a model call outside torch's hooks tells (its record, its owner, its replay)."""
        try:
            inputs = inputs_of(args, kwargs)
            record = {"module": type(owner).__name__, "method": method, "kind": kind, "param_device": None, "training": False, "training_changes_output": False}
            record.update(self._describe_call(inputs, ms))
            record["grad"] = False
            record["frame"] = is_frame(inputs)  # (named columns: the fixes keep them)
            self._record_forward(record)
            if current_evidence() is not None:
                self.own(record["fp"], owner, method, inputs_of)
            if replay_of is not None and self.wants(record["fp"]) and record["batch"]:
                replay = replay_of(owner, detached(args), detached(kwargs))
                if replay is not None:
                    self.capture(record["fp"], replay, kind, None)
        except Exception as exc:
            sw.fail(exc)

    def _model_call(
        self,
        original: Callable[..., Any],
        kind: str,
        inputs_of: Callable[[tuple[Any, ...], dict[str, Any]], Any],
        replay_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None,
    ) -> Callable[..., Any]:
        """A model call outside torch's module hooks, timed as ``infer`` (only the outermost:
        a scikit-learn Pipeline's steps, or the torch modules under ``encode``, stay inside)."""
        infer = stage("infer")
        sw = self.switch(f"{kind} {original.__name__}")
        probes = self

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if not sw.on or _in_model_call.get() or current_stage_name() == "infer":
                return original(self_, *args, **kwargs)
            t0 = time.perf_counter_ns()
            token = _in_model_call.set(True)
            try:
                with infer:  # (the probe's own reading of the call too, as torch's hooks do: not the user's stages between calls)
                    out = original(self_, *args, **kwargs)
                    ms = (time.perf_counter_ns() - t0) / 1e6
                    probes._note_call(self_, original.__name__, kind, args, kwargs, ms, inputs_of, replay_of, sw)
            finally:
                _in_model_call.reset(token)
            return out

        return wrapper


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def _first_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else next(iter(kwargs.values()), None)


def _first_arg_replay(method: str) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """Replays ``obj.method(X, ...)`` with X's first row replicated (a scikit-learn estimator on
    an array or DataFrame, ``encode`` on a list of texts)."""

    def make(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not args:
            return None
        x, rest = args[0], args[1:]
        if isinstance(x, str):
            x = [x]  # encode("one text"): the same text as a list of one

        def replay(b: int) -> Callable[[], Any]:
            xb = replicate(x, b)
            return lambda: getattr(obj, method)(xb, *rest, **kwargs)

        return replay

    return make


def _ort_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("input_feed")


def _ort_replay(session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    names = args[0] if args else kwargs.get("output_names")
    feed = _ort_inputs(args, kwargs)
    if not isinstance(feed, Mapping):
        return None

    def replay(b: int) -> Callable[[], Any]:
        fb = replicate(dict(feed), b)
        return lambda: session.run(names, fb)

    return replay
