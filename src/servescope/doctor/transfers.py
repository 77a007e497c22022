"""Probes of torch's own calls beyond the model's forward: host<->device copies
(``Tensor.to/.cuda/.cpu``), sync points (``.item/.tolist/.numpy`` of device tensors), models
moved between devices, and models built inside a request (``nn.Module.__init__`` and the
weights it allocates). A mixin of ``Probes`` (probes.py), which owns the patching and the
switches."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from ..timing import stage
from .context import current_evidence

__all__ = ["TorchCallProbes"]


class TorchCallProbes:
    """The methods of ``Probes`` that wrap torch's tensor and module calls."""

    SMALL_COPY = 4096  # bytes: many copies this small per request are overhead, not data
    switch: Callable[..., Any]
    model_types: dict[type, int]

    def _tensor_copy(self, torch: Any, original: Callable[..., Any], *, is_to: bool = False) -> Callable[..., Any]:
        to_device, to_host = stage("to_device"), stage("to_host")
        sw = self.switch(f"Tensor.{original.__name__}")

        @functools.wraps(original)
        def wrapper(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if not sw.on or (is_to and (not args or isinstance(args[0], torch.dtype)) and "device" not in kwargs):
                return original(self_, *args, **kwargs)  # a dtype change: no copy between devices
            try:
                src = self_.device.type
                ev = current_evidence()
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
                    if nbytes <= TorchCallProbes.SMALL_COPY:
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
                        ev = current_evidence()
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
                ev, before = current_evidence(), device_of(self_)
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
                    ev = current_evidence()
                    if ev is not None:
                        now = time.perf_counter_ns()
                        self.model_types[type(self_)] = self.model_types.get(type(self_), 0) + 1
                        ev["constructed"] += 1
                        if ev["first_init_ns"] is None:
                            ev["first_init_ns"] = now
                        ev["last_init_ns"] = now
                except Exception as exc:
                    sw.fail(exc)
            original(self_, *args, **kwargs)

        return wrapper

    def _param_new(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``nn.Parameter`` creation: weights allocated during a request are a model being
        built (a module without weights, ``nn.Softmax()``, is not)."""
        sw = self.switch("Parameter.__new__")

        def new(cls: Any, data: Any = None, requires_grad: bool = True) -> Any:
            out = original(cls, data, requires_grad)
            if sw.on:
                try:
                    ev = current_evidence()
                    if ev is not None:
                        ev["params_built"] += int(out.numel())
                except Exception as exc:
                    sw.fail(exc)
            return out

        return new


def _pinned(t: Any) -> bool:
    try:
        return bool(t.is_pinned())
    except Exception:  # meta tensors, no CUDA runtime: not pinned
        return False
