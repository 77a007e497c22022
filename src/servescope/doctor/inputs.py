"""Model inputs in every shape users pass them: positional tensors, keyword tensors
(``model(**inputs)``), tokenizer output (a ``BatchEncoding``, a dict), lists and tuples of
tensors, numpy arrays (ONNX Runtime's ``input_feed``), pandas DataFrames (scikit-learn).

What the probes read from them (batch size, device, padding, a cheap fingerprint) and how the
batch probe replays them at another batch size (the first row, replicated).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any, Iterator

__all__ = ["detached", "fingerprint", "first_array", "is_frame", "leaves", "pad_share", "replicate", "text_batch", "texts_of", "vary"]

#: Inputs up to this many values are hashed whole (under a millisecond); bigger ones by a
#: strided sample of ``_SAMPLE`` values (images differ everywhere, so a sample tells them apart).
FULL_HASH_ITEMS = 1 << 16
_SAMPLE = 4096
#: A frame this small is read by its values' repr (microseconds): pandas' own hash factorizes
#: each object column first, 0.65 ms a call on a one-row frame of strings, and a loop of 40
#: `predict_proba(row.to_frame().T)` calls paid 26 ms a request for the doctor's fingerprints
SMALL_FRAME_ITEMS = 256


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "shape") and hasattr(x, "device")


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and (_is_tensor(x) or type(x).__module__.startswith("numpy"))


def is_frame(x: Any) -> bool:
    return type(x).__module__.startswith("pandas") and hasattr(x, "iloc")


def leaves(obj: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(key, array) for every tensor/array in args, kwargs, dicts, lists and tuples."""
    if depth > 4:
        return
    if _is_array(obj) or is_frame(obj):
        yield "", obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            for kk, leaf in leaves(v, depth + 1):
                yield (str(k) if not kk else kk), leaf
    elif isinstance(obj, (list, tuple)) and obj and len(obj) <= 64:
        for v in obj:
            yield from leaves(v, depth + 1)


def first_array(obj: Any) -> Any:
    """The first tensor/array with a batch axis (``ndim > 0``), or None."""
    for _, leaf in leaves(obj):
        if getattr(leaf, "ndim", len(getattr(leaf, "shape", ()))) > 0:
            return leaf
    return None


#: keyword arguments that hand a decoder the cache of the tokens it has seen
_CACHE_ARGS = ("past_key_values", "cache", "past", "cache_params", "layer_past")


def decode_step(inputs: Any) -> tuple[int | None, bool]:
    """(the length of a call's token ids, whether it was handed a cache): a decoder recomputing
    its whole prefix is called with ids one longer every step and no cache."""
    ids = next((leaf for _, leaf in leaves(inputs) if len(getattr(leaf, "shape", ())) == 2 and "int" in str(getattr(leaf, "dtype", ""))), None)
    kwargs = inputs[1] if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], Mapping) else {}
    cached = any(kwargs.get(k) is not None for k in _CACHE_ARGS)
    return (int(ids.shape[1]) if ids is not None else None), cached


def texts_of(obj: Any, depth: int = 0) -> list[str] | None:
    """The texts a model call was given (``encode(["a", "b"])``, ``pipe("a")``), when its inputs
    are texts rather than arrays."""
    if depth > 3:
        return None
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(v, str) for v in obj):
        return list(obj)
    if isinstance(obj, (list, tuple)) and obj:
        return texts_of(obj[0], depth + 1)
    if isinstance(obj, Mapping):
        return next((t for t in (texts_of(v, depth + 1) for v in obj.values()) if t is not None), None)
    return None


def _is_row(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in v)


def number_rows(obj: Any) -> list[Any] | None:
    """Rows of numbers given as nested lists (``model.predict([features])``, as scikit-learn
    tutorials call it), or None: a list whose every item is a non-empty list of numbers."""
    if isinstance(obj, list) and obj and len(obj) <= 4096 and all(_is_row(v) for v in obj):
        return obj
    return None


def text_batch(obj: Any) -> int | None:
    """How many texts a call was given, or None when it was given none."""
    texts = texts_of(obj)
    return len(texts) if texts is not None else None


def pad_share(obj: Any) -> float | None:
    """The share of padding in an ``attention_mask`` among the inputs (0 = none), or None
    when there is no mask. Only read on the CPU (reading a device tensor would sync)."""
    for key, leaf in leaves(obj):
        if key == "attention_mask" and hasattr(leaf, "sum") and getattr(getattr(leaf, "device", None), "type", "cpu") == "cpu":
            n = int(leaf.numel()) if hasattr(leaf, "numel") else int(leaf.size)
            if n:
                return round(1.0 - float(leaf.sum()) / n, 4)
    return None


class _Unreadable(Exception):
    """An input the doctor may not read (on a device: reading it would sync)."""


def _sample_bytes(leaf: Any) -> bytes:
    """Every value of an input up to ``FULL_HASH_ITEMS`` (token ids padded to 512 differ in a
    few places only: a sample would miss them), a strided sample of bigger ones."""
    if is_frame(leaf):
        if leaf.size <= SMALL_FRAME_ITEMS:  # (a row or a few, as a per-row loop passes them)
            return repr((leaf.shape, list(leaf.columns)[:16], leaf.to_numpy().tolist())).encode()
        pd = sys.modules["pandas"]  # a frame's own library: already loaded, never a dependency of ours
        rows = leaf if leaf.size <= FULL_HASH_ITEMS else leaf.iloc[:: max(1, len(leaf) // _SAMPLE)]
        return repr((leaf.shape, list(leaf.columns)[:16])).encode() + pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes()
    if _is_tensor(leaf):
        if leaf.device.type != "cpu":
            raise _Unreadable("on a device")
        flat = leaf.detach().reshape(-1)
        if flat.shape[0] > FULL_HASH_ITEMS:
            flat = flat[:: max(1, flat.shape[0] // _SAMPLE)][:_SAMPLE]
        if not flat.dtype.is_complex and flat.dtype.itemsize == 2 and flat.dtype.is_floating_point:
            flat = flat.float()  # numpy has no bfloat16
        return flat.contiguous().numpy().tobytes()
    flat = leaf.reshape(-1)
    if flat.shape[0] > FULL_HASH_ITEMS:
        flat = flat[:: max(1, flat.shape[0] // _SAMPLE)][:_SAMPLE]
    return flat.tobytes()


def fingerprint(obj: Any) -> str | None:
    """Shape, dtype and a hash of the values of every array among the inputs (all of them up
    to ``FULL_HASH_ITEMS``): the same string for the same input, request after request
    (``repeated-work``); None when there is no array, or one cannot be read (on a device)."""
    h = hashlib.blake2b(digest_size=8)
    seen = False
    for key, leaf in leaves(obj):
        try:
            h.update(repr((key, tuple(leaf.shape), str(getattr(leaf, "dtype", "")))).encode())
            h.update(_sample_bytes(leaf))
        except _Unreadable:
            return None  # equal shapes are not equal inputs: say nothing rather than guess
        except Exception:  # an exotic array type: its shape alone
            continue
        seen = True
    rows = number_rows(obj) if not seen else None
    if rows is not None:
        h.update(repr(("rows", len(rows))).encode())
        h.update(repr(rows[:64]).encode())
        return h.hexdigest()
    if not seen:
        texts = texts_of(obj)
        if texts is None:
            return None
        h.update(repr(("texts", len(texts))).encode())
        for t in texts:
            h.update(t.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        seen = True
    return h.hexdigest()


def replicate(obj: Any, b: int, depth: int = 0) -> Any:
    """``obj`` with every array's first row repeated ``b`` times along the batch axis; the
    structure (dict, BatchEncoding, list, tuple) and everything else kept as is."""
    if depth > 4:
        return obj
    if is_frame(obj):
        return obj.iloc[[0] * b]
    if _is_tensor(obj):
        if obj.dim() == 0:
            return obj
        return obj[:1].expand(b, *obj.shape[1:]).contiguous()
    if _is_array(obj):
        if obj.ndim == 0:
            return obj
        import numpy as np

        return np.repeat(obj[:1], b, axis=0)
    if isinstance(obj, Mapping):
        out = {k: replicate(v, b, depth + 1) for k, v in obj.items()}
        try:
            return type(obj)(out)  # BatchEncoding and other dict types keep their type
        except Exception:
            return out
    if isinstance(obj, tuple):
        return tuple(replicate(v, b, depth + 1) for v in obj)
    if isinstance(obj, list) and obj and not any(_is_array(v) or isinstance(v, (Mapping, list, tuple)) for v in obj):
        return [obj[0]] * b  # a list of rows (texts, feature lists): one row replicated
    if number_rows(obj) is not None:
        return [list(obj[0]) for _ in range(b)]  # rows of numbers as nested lists: the first row, b times
    if isinstance(obj, list):
        return [replicate(v, b, depth + 1) for v in obj]
    return obj


def detached(obj: Any, depth: int = 0) -> Any:
    """A copy the batch probe can replay later: tensors detached and cloned (the endpoint may
    change its own in place), arrays copied, the structure kept."""
    if depth > 4:
        return obj
    if _is_tensor(obj):
        return obj.detach().clone()
    if _is_array(obj) or is_frame(obj):
        return obj.copy()
    if isinstance(obj, Mapping):
        out = {k: detached(v, depth + 1) for k, v in obj.items()}
        try:
            return type(obj)(out)
        except Exception:
            return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(detached(v, depth + 1) for v in obj)
    return obj



def vary(payload: Any, depth: int = 0) -> Any:
    """The payload with what reaches the model changed a little: another request of the same
    shape. Strings are lengthened, decimals nudged; an image sent as base64 (or a data URL)
    is decoded, a few pixels changed and encoded again in its own format, since text appended
    to base64 is dropped by the decoder (the image, and the model's input, would stay the
    same) or breaks it. Other long text in the base64 alphabet (audio, arrays, a protein, a
    hash) has one character in its middle changed, so what decodes still decodes. An array of
    whole numbers has one changed; single whole numbers and booleans stay (they are often ids,
    counts and switches whose other values the endpoint may refuse)."""
    if depth > 8:
        return payload
    if isinstance(payload, str):
        return _vary_text(payload)
    if isinstance(payload, float):
        return payload * 1.01 + 0.01
    if isinstance(payload, dict):
        return {k: vary(v, depth + 1) for k, v in payload.items()}
    if isinstance(payload, list):
        if len(payload) >= ARRAY_LEN and all(type(v) is int for v in payload):
            return _vary_ints(payload)
        return [vary(v, depth + 1) for v in payload]
    return payload


#: a list of this many whole numbers is data (pixels, token ids, a signal), not ids and counts
ARRAY_LEN = 8


def _vary_ints(values: list[int]) -> list[int]:
    """The middle number changed to another the array already holds (its smallest or largest:
    a pixel stays a pixel, a token id stays in the vocabulary)."""
    lo, hi = min(values), max(values)
    if lo == hi:  # a constant array (a mask of ones) is no content: any other value would be out of range
        return values
    mid = len(values) // 2
    out = list(values)
    out[mid] = lo if values[mid] != lo else hi
    return out


_B64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_\n\r")
#: the first bytes of the image formats Pillow reads
IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")


#: text this long may be cut by a tokenizer's ``truncation=True`` (256 tokens are about 1,000
#: characters of English; short limits are common): varied at its start as well as its end
LONG_TEXT = 200


def _vary_text(s: str) -> str:
    head, sep, body = s.partition(",") if s.startswith("data:") and ";base64," in s[:64] else ("", "", s)
    if len(body) < 64 or not _B64.issuperset(body[:4096].encode("ascii", "replace")):
        # text; a long one is changed at its start too: a tokenizer that truncates keeps the start,
        # and a model input that did not change would make its call look repeated
        return ("More: " if len(s) >= LONG_TEXT else "") + s + " and more"
    import base64
    import binascii

    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_" if ("-" in body or "_" in body) else None)
    except (binascii.Error, ValueError):
        return s + " and more"
    changed = vary_image(raw) if raw.startswith(IMAGE_MAGIC) else None
    if changed is None:
        # not an image (or one Pillow cannot write back): one character in its middle changed
        # for another of the alphabet, so it still decodes (three bytes of its data differ)
        # and text that only looks like base64 (a protein, a hash) is varied too
        mid = len(body) // 2
        mid -= 1 if body[mid] == "=" else 0
        swap = "B" if body[mid] != "B" else "C"
        return head + sep + body[:mid] + swap + body[mid + 1 :]
    out = base64.b64encode(changed).decode("ascii")
    if "-" in body or "_" in body:
        out = out.replace("+", "-").replace("/", "_")
    return head + sep + out


def vary_image(raw: bytes) -> bytes | None:
    """The image with a band of pixels inverted, in its own format; None without Pillow."""
    try:
        import io

        import numpy as np
        from PIL import Image
    except ImportError:
        return None
    try:
        img = Image.open(io.BytesIO(raw))
        fmt = img.format or "PNG"
        arr = np.array(img.convert("RGB") if img.mode not in ("RGB", "L", "RGBA") else img)
        h = max(1, arr.shape[0] // 8)
        arr[:h] = 255 - arr[:h]  # a band across the top: survives resizing and JPEG
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format=fmt)
        return buf.getvalue()
    except Exception:  # an image Pillow cannot write back: leave it as it is
        return None
