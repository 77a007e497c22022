"""What the worker does with a batch: preprocess, collate, copy, forward, split, postprocess,
serialize, each timed; one item's failure stays that item's.

torch is imported only when the user's model is a torch model or returns tensors.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import orjson

from ..environment import available_cpus
from ..timing import resolve_clock
from .batching import Item
from .model import Model

__all__ = ["Runtime"]

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _default(obj: Any) -> Any:
    if _is_tensor(obj):
        return obj.detach().cpu().numpy()  # orjson writes numpy arrays natively: no tolist()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}: return JSON-friendly values from postprocess")


def _msgpack_default(obj: Any) -> Any:
    value = _default(obj)
    return value.tolist() if hasattr(value, "tolist") else value


def serialize(result: Any, accept: str) -> bytes:
    if accept == "msgpack":
        import msgpack

        return msgpack.packb(result, default=_msgpack_default)
    return orjson.dumps(result, default=_default, option=_JSON_OPTS)


class Runtime:
    """Loads the model once, warms it up, and processes batches for the Batcher."""

    def __init__(self, model: Model, *, device: str | None = None, threads: int | None = None) -> None:
        self.model = model
        self.requested_device = device
        self.requested_threads = threads
        self.device = "cpu"
        self.clock: Any = None
        self._pinned: dict[tuple[Any, ...], Any] = {}
        self.info: dict[str, Any] = {}
        #: called on the worker thread with each finished batch (the server resolves futures)
        self.on_batch_done: Callable[[list[Item]], None] | None = None

    # -- start-up ----------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """Pick the device and threads, load once, eval(), and say what was picked."""
        torch = _torch()
        try:
            import torch  # noqa: F811 - the runtime is for torch models first
        except ImportError:
            torch = None
        device = self.requested_device
        if device is None:
            device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
        self.device = device
        cpus = available_cpus()
        if torch is not None:
            threads = self.requested_threads or max(1, int(cpus))
            torch.set_num_threads(threads)
            self.info["torch_threads"] = threads
        t0 = time.perf_counter()
        loaded = self.model.load(device)
        if loaded is None:
            raise TypeError(f"{type(self.model).__name__}.load() returned None: return the model")
        if torch is not None and isinstance(loaded, torch.nn.Module):
            loaded = loaded.to(device).eval()
        self.model.model = loaded
        self.model.device = device
        self.info.update(device=device, cpus_available=cpus, load_s=round(time.perf_counter() - t0, 3))
        # CUDA is initialised now if it is used: events time the device stages right
        self.clock = resolve_clock("auto", None)
        return self.info

    def warm_up(self, example: Any, batch_sizes: list[int]) -> list[int]:
        """Run the example through every stage at each batch size; raises if it fails."""
        item = self.model.validate(example)
        for n in batch_sizes:
            items = [Item(item) for _ in range(n)]
            self.process(items)
            failed = [i for i in items if i.error]
            if failed:
                raise RuntimeError(f"warm-up at batch size {n} failed: {failed[0].error}")
        return batch_sizes

    # -- the batch ---------------------------------------------------------------------------
    def process(self, items: list[Item]) -> None:
        try:
            self._process(items)
        except Exception as exc:  # a bug of ours or a hook's: fail the batch, keep the worker
            for it in items:
                if it.body is None and it.error is None:
                    _fail(it, exc, 500)
        if self.on_batch_done is not None:
            self.on_batch_done(items)

    def _process(self, items: list[Item]) -> None:
        now = time.perf_counter_ns
        start = now()
        model = self.model
        inputs = []
        live = []
        for it in items:
            if it.enqueued_ns:
                it.durations["queue"] = start - it.enqueued_ns
            t = now()
            if it.unvalidated:
                try:
                    it.payload = model.validate(it.payload)
                except Exception as exc:
                    _fail(it, exc, 422, "validate")
                    continue
                finally:
                    it.durations["validate"] = it.durations.get("validate", 0) + now() - t
                t = now()
            try:
                inputs.append(model.preprocess(it.payload))
                live.append(it)
            except KeyError as exc:  # a field the request lacks is the request's fault: 422
                missing = exc.args[0] if exc.args else None
                bad_request = isinstance(it.payload, dict) and isinstance(missing, str) and missing not in it.payload
                _fail(it, exc, 422 if bad_request else 500, "preprocess")
            except Exception as exc:
                _fail(it, exc, 500, "preprocess")
            it.durations["preprocess"] = now() - t
        if live:
            outputs = self._forward(live, inputs)
            for it, out in zip(live, outputs):
                if it.error is not None:
                    continue
                t = now()
                try:
                    result = model.postprocess(out)
                except Exception as exc:
                    _fail(it, exc, 500, "postprocess")
                    continue
                t2 = now()
                try:
                    body = serialize(result, it.accept)
                    if it.accept != "msgpack" and b"null" in body and _nonfinite(result):
                        raise NonFiniteOutput("the model's output holds NaN or infinity, which JSON cannot carry")
                    it.body = body
                except Exception as exc:
                    _fail(it, exc, 500, "serialize")
                    continue
                it.durations["postprocess"] = t2 - t
                it.durations["serialize"] = now() - t2

    def _forward(self, items: list[Item], inputs: list[Any]) -> list[Any]:
        """Collate, copy, forward, copy back and split; on failure retry one by one."""
        try:
            return self._batched(items, inputs)
        except Exception as exc:
            if len(items) == 1:
                _fail(items[0], exc, 500, "forward")
                return [None]
        outs = []
        for it, x in zip(items, inputs):  # batch-mates of a bad item still get answers
            try:
                outs.append(self._batched([it], [x])[0])
            except Exception as exc:
                _fail(it, exc, 500, "forward")
                outs.append(None)
        return outs

    def _batched(self, items: list[Item], inputs: list[Any]) -> list[Any]:
        clock = self.clock
        torch = _torch()
        m0 = clock.mark()
        batch = collate(inputs)
        batch = self._to_device(batch)
        m1 = clock.mark()
        if torch is not None:
            with torch.inference_mode():
                out = self.model.infer(batch)
        else:
            out = self.model.infer(batch)
        m2 = clock.mark()
        out = to_host(out)
        m3 = clock.mark()
        ns = clock.resolve(m0, [m1, m2, m3])
        for it in items:  # each item waited for the whole batch's copy and forward
            it.durations["to_device"] = ns[0]
            it.durations["infer"] = ns[1] - ns[0]
            it.durations["to_host"] = ns[2] - ns[1]
        return split(out, len(items))

    def _to_device(self, batch: Any) -> Any:
        if self.device == "cpu":  # preprocess made it on the CPU: nothing to move
            return batch
        if not _is_tensor(batch):
            return to_device(batch, self.device)
        # CUDA: stage through a pinned buffer reused per shape, then a non-blocking copy
        key = (tuple(batch.shape), batch.dtype)
        buf = self._pinned.get(key)
        if buf is None:
            buf = self._pinned[key] = batch.new_empty(batch.shape).pin_memory()
        buf.copy_(batch)
        return buf.to(self.device, non_blocking=True)


def _fail(item: Item, exc: BaseException, status: int, stage: str = "model") -> None:
    """Mark ``item`` failed. ``error`` is the full text, for warm-up and the server's log; what
    the client is told is decided by the server (in general terms, unless debugging)."""
    item.error = f"{type(exc).__name__}: {exc}"
    item.status = status
    item.exc = exc
    item.stage = stage


def _nonfinite(value: Any, depth: int = 0) -> bool:
    """Whether a result holds NaN or infinity (which JSON cannot carry: orjson writes null)."""
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if depth > 16:
        return False
    if isinstance(value, dict):
        return any(_nonfinite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v, depth + 1) for v in value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind in ("f", "c"):  # numpy arrays and scalars
        import numpy as np

        return not bool(np.isfinite(value).all())
    if hasattr(value, "is_floating_point") and value.is_floating_point():  # a torch tensor
        return not bool(value.isfinite().all())
    return False


class NonFiniteOutput(ValueError):
    """The model's output held NaN or infinity: JSON cannot carry them (served as an error,
    never as a silent ``null``; msgpack carries them as they are)."""


def collate(inputs: list[Any]) -> Any:
    """Items' tensors stacked along a new first dimension (dicts and tuples per field)."""
    first = inputs[0]
    torch = _torch()
    if isinstance(first, dict):
        return {k: collate([x[k] for x in inputs]) for k in first}
    if isinstance(first, (tuple, list)) and first and not isinstance(first[0], (int, float)):
        return type(first)(collate(list(xs)) for xs in zip(*inputs))
    if torch is not None:
        if isinstance(first, torch.Tensor):
            return first.unsqueeze(0) if len(inputs) == 1 else torch.stack(inputs)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(first, np.ndarray):
            return torch.from_numpy(np.stack(inputs))
        if isinstance(first, (int, float, list)):
            return torch.tensor(inputs)
    return inputs


def to_device(batch: Any, device: str) -> Any:
    if _is_tensor(batch):
        return batch if str(batch.device) == device else batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_host(out: Any) -> Any:
    """One device-to-host copy per batch (not per item)."""
    if _is_tensor(out):
        return out.cpu() if out.device.type != "cpu" else out
    if isinstance(out, dict):
        return {k: to_host(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(to_host(v) for v in out)
    return out


def split(out: Any, n: int) -> list[Any]:
    """A batch's output split back into one output per item."""
    if isinstance(out, dict):
        parts = {k: split(v, n) for k, v in out.items()}
        return [{k: parts[k][i] for k in out} for i in range(n)]
    if isinstance(out, tuple):
        parts_t = [split(v, n) for v in out]
        return [tuple(p[i] for p in parts_t) for i in range(n)]
    if _is_tensor(out) and out.dim():
        if out.shape[0] != n:
            raise ValueError(f"the model returned {out.shape[0]} outputs for a batch of {n}")
        return list(out.unbind(0))  # one C call for the whole split
    if hasattr(out, "__getitem__") and hasattr(out, "__len__"):
        if len(out) != n:
            raise ValueError(f"the model returned {len(out)} outputs for a batch of {n}")
        return [out[i] for i in range(n)]
    raise TypeError(f"cannot split a batch output of type {type(out).__name__}: override infer() to return one output per item")
