"""A batch's shape on its way through the worker: the items collated into one batch (padded
to the longest), moved to the device and back in one copy each way, split into one output per
item, and each answer serialized (orjson, or msgpack), refusing NaN and infinity that JSON
cannot carry. The runtime (runtime.py) and ``Model``'s default ``collate``/``split`` use them.

Nothing here imports torch: a tensor is one only where torch is already loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["NonFiniteOutput", "collate", "serialize", "split", "to_device", "to_host"]


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


def collate(inputs: list[Any], pad_values: Mapping[str, float] | None = None) -> Any:
    """Items into one batch, as models take them: tensors, numpy arrays and lists of numbers
    stacked along a new first dimension, right-padded to the longest item when lengths differ
    (with ``pad_values[field]``, 0 by default: attention masks and token type ids pad with 0);
    dicts and tuples field by field. A tokenizer's output (``BatchEncoding``, whose tensors
    already have a batch dimension of 1) is concatenated along that dimension instead."""
    first = inputs[0]
    pads = pad_values or {}
    if isinstance(first, Mapping):
        joined = type(first).__name__ == "BatchEncoding"
        return {k: _collate_field([x[k] for x in inputs], pads.get(k, 0), joined) for k in first}
    if isinstance(first, (tuple, list)) and first and not isinstance(first[0], (int, float)):
        if not _fields(inputs):  # a list of texts, images ... per item: the batch is the items' lists
            return list(inputs)
        return type(first)(collate(list(xs), pads) for xs in zip(*inputs))
    return _collate_field(inputs, pads.get("", 0), False)


def _fields(inputs: list[Any]) -> bool:
    """Whether the items' tuples (or lists) are fields to batch one by one, as ``(input_ids,
    attention_mask)`` are: the same number in every item, each a tensor, an array, a dict, a
    tuple or a list of numbers. A list of strings (sentences) or of images is an item's data."""
    n = len(inputs[0])
    np = sys.modules.get("numpy")
    torch = _torch()
    kinds = tuple(k for k in (Mapping, tuple, getattr(np, "ndarray", None), getattr(torch, "Tensor", None)) if k is not None)
    for x in inputs:
        if len(x) != n:
            return False
        for v in x:
            if not (isinstance(v, kinds) or (isinstance(v, list) and v and isinstance(v[0], (int, float)))):
                return False
    return True


def _collate_field(values: list[Any], pad: float, joined: bool) -> Any:
    torch = _torch()
    first = values[0]
    if isinstance(first, Mapping) or (isinstance(first, tuple) and first and not isinstance(first[0], (int, float))):
        return collate(values)
    if torch is None:
        return values
    np = sys.modules.get("numpy")
    if np is not None and isinstance(first, np.ndarray):
        values = [torch.from_numpy(v) for v in values]
        first = values[0]
    elif isinstance(first, list) and all(isinstance(v, list) for v in values):
        if len({len(v) for v in values}) > 1:  # ragged token ids: pad to the longest
            width = max(len(v) for v in values)
            values = [v + [pad] * (width - len(v)) for v in values]
        return torch.tensor(values)
    elif isinstance(first, (int, float)):
        return torch.tensor(values)
    if not isinstance(first, torch.Tensor):
        return values
    if joined and all(v.dim() >= 1 and v.shape[0] == 1 for v in values):
        return torch.cat(_padded(values, pad, torch), 0) if len(values) > 1 else first
    if len(values) == 1:
        return first.unsqueeze(0)
    return torch.stack(_padded(values, pad, torch))


def _padded(tensors: list[Any], pad: float, torch: Any) -> list[Any]:
    """The tensors right-padded to the largest size along every dimension (as they are when
    their shapes already agree)."""
    shape = tensors[0].shape
    if all(t.shape == shape for t in tensors):
        return tensors
    if len({t.dim() for t in tensors}) > 1:
        raise ValueError(f"cannot batch tensors of different ranks: {sorted({t.dim() for t in tensors})}")
    size = [max(sizes) for sizes in zip(*(t.shape for t in tensors))]
    out = []
    for t in tensors:
        if list(t.shape) == size:
            out.append(t)
            continue
        full = t.new_full(size, pad)
        full[tuple(slice(0, n) for n in t.shape)] = t
        out.append(full)
    return out


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
