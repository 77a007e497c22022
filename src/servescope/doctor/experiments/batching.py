"""Concurrent requests sharing one model call: what a dynamic batcher (``servescope.serve``,
or a batcher of your own) would do, tried on the endpoint as written, at the concurrency
the doctor ran.

While applied, the method the requests call for their model work (a module's ``forward``,
``encode``, ``InferenceSession.run``, ``predict_proba``) is wrapped on its instance: a call
that finds the model busy waits, and the next caller to get it runs every call waiting then
as one, concatenated along the batch axis, and hands each caller its own rows. A lone call
never waits. Calls whose inputs do not line up (other shapes, other options) run apart. The
first merged call is checked against the same input run alone: a model whose rows depend on
each other (or an output without a batch axis) is not batched, and the fix is not tried.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from typing import Any, Callable

from ..evidence import Evidence, WhatIf
from ..inputs import is_frame, number_rows
from .answers import close, plain
from .lab import Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["Mismatch", "batch_calls", "merge", "run_merged", "split"]

MAX_BATCH = 16


class Mismatch(Exception):
    """Inputs that cannot be stacked into one call."""


def _kind(x: Any, stack_rows: bool = True) -> str:
    mod = type(x).__module__
    if mod.startswith("torch") and hasattr(x, "shape") and hasattr(x, "device"):
        return "tensor"
    if mod.startswith("numpy") and hasattr(x, "shape") and getattr(x, "ndim", 0) > 0:
        return "array"
    if is_frame(x):
        return "frame"
    if stack_rows and isinstance(x, list) and x and all(isinstance(v, str) for v in x):
        return "texts"
    if stack_rows and (r := number_rows(x)) is not None and len({len(v) for v in r}) == 1:  # model.predict([features])
        return "rows"
    return ""


def _rows(x: Any) -> int:
    return len(x) if _kind(x) in ("texts", "rows", "frame") else int(x.shape[0])


def merge(items: list[Any], depth: int = 0, stack_rows: bool = True) -> tuple[Any, list[int]]:
    """The items' inputs stacked along the first axis, and each item's row count (from its
    first batched leaf). Raises ``Mismatch`` when they do not line up. ``stack_rows``: lists of
    texts or of number lists are rows to stack (a positional input), not an option that must
    be equal (a zero-shot pipeline's ``candidate_labels``)."""
    first = items[0]
    kind = _kind(first, stack_rows)
    if kind:
        if any(_kind(x, stack_rows) != kind for x in items):
            raise Mismatch("mixed input types")
        rows = [_rows(x) for x in items]
        if kind in ("texts", "rows"):
            return [t for x in items for t in x], rows
        if kind == "frame":
            pd = sys.modules["pandas"]  # the frame's own library: already loaded, never a dependency of ours
            return pd.concat(items, ignore_index=True), rows
        if any(x.shape[1:] != first.shape[1:] or x.dtype != first.dtype for x in items):
            raise Mismatch("different shapes")
        if kind == "tensor":
            import torch

            if any(x.device != first.device for x in items):
                raise Mismatch("different devices")
            return torch.cat(list(items), 0), rows
        import numpy as np

        return np.concatenate(items, 0), rows
    if depth > 4:
        raise Mismatch("too deep")
    if isinstance(first, dict):
        if any(not isinstance(x, dict) or x.keys() != first.keys() for x in items):
            raise Mismatch("different keys")
        out, rows = {}, None
        for k in first:
            out[k], r = merge([x[k] for x in items], depth + 1, stack_rows)
            rows = rows or (r if any(r) else None)
        try:
            merged: Any = type(first)(out)
        except Exception:
            merged = out
        return merged, rows or [0] * len(items)
    if isinstance(first, (list, tuple)):
        if any(type(x) is not type(first) or len(x) != len(first) for x in items):
            raise Mismatch("different lengths")
        parts, rows = [], None
        for i in range(len(first)):
            p, r = merge([x[i] for x in items], depth + 1, stack_rows)
            parts.append(p)
            rows = rows or (r if any(r) else None)
        return type(first)(parts), rows or [0] * len(items)
    if any(not _equal(x, first) for x in items):
        raise Mismatch("different options")
    return first, [0] * len(items)


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:
        return False


def split(out: Any, rows: list[int], depth: int = 0, like: Any = None) -> list[Any]:
    """Each caller's rows of a merged call's output (leaves without the batch axis: the same
    object for every caller; ``like``: one call's answer run alone, where known)."""
    total = sum(rows)
    ends = list(itertools.accumulate(rows))
    bounds = list(zip([0, *ends[:-1]], ends))
    kind = _kind(out)
    if kind or (hasattr(out, "shape") and getattr(out, "ndim", 0) > 0):
        if _rows(out) != total:
            raise Mismatch("the output has no batch axis")
        if kind == "frame":
            return [out.iloc[a:b] for a, b in bounds]
        return [out[a:b] for a, b in bounds]
    if isinstance(out, list) and len(out) == total and not any(_has_array(v) for v in out) and not _columns(out, like):
        return [out[a:b] for a, b in bounds]  # (one answer per input: a pipeline's dicts, lists of entities, numbers)
    if depth > 4:
        return [out] * len(rows)
    if isinstance(out, dict):
        parts = {k: split(v, rows, depth + 1, like.get(k) if isinstance(like, dict) else None) for k, v in out.items()}
        res = []
        for i in range(len(rows)):
            d = {k: v[i] for k, v in parts.items()}
            try:
                res.append(type(out)(**d) if hasattr(out, "to_tuple") else type(out)(d))
            except Exception:
                res.append(d)
        return res
    if isinstance(out, (list, tuple)):
        same = isinstance(like, (list, tuple)) and len(like) == len(out)
        cols = [split(v, rows, depth + 1, like[j] if same else None) for j, v in enumerate(out)]
        return [type(out)(c[i] for c in cols) if isinstance(out, tuple) else [c[i] for c in cols] for i in range(len(rows))]
    return [out] * len(rows)


def _columns(out: list[Any], like: Any) -> bool:
    """Whether a merged list answer is columns (``[labels, scores]``, each as long as the
    batch) rather than one entry per input, as a lone call's answer shows: a list of as many
    lists, each shorter than the merged call's (with two callers of one item each, both forms
    are lists of two)."""
    if not isinstance(like, (list, tuple)) or len(like) != len(out) or not like:
        return False
    if not all(isinstance(c, (list, tuple)) for c in (*like, *out)):
        return False
    return len({len(c) for c in like}) == 1 and {len(c) for c in out} == {len(out)} and len(like[0]) < len(out)


def _has_array(x: Any, depth: int = 0) -> bool:
    """Whether ``x`` holds an array or a tensor with an axis (a batched leaf), in its first
    levels (a numpy scalar, as a token-classification pipeline's scores, is a number)."""
    if hasattr(x, "shape"):
        return len(x.shape) > 0
    if depth > 3:
        return False
    if isinstance(x, dict):
        return any(_has_array(v, depth + 1) for v in x.values())
    return isinstance(x, (list, tuple)) and any(_has_array(v, depth + 1) for v in x[:8])


def _alone(row: Any, like: Any) -> Any:
    """A one-text call's answer from its one row: the row's only element (``encode("a")`` is
    one vector), or the row as it is where the call alone answers in that form (a
    text-classification pipeline answers one text with a list of one dict)."""
    if like is not None and _form(row[0]) != _form(like) and _form(row) == _form(like):
        return row
    return row[0]


def _form(x: Any, depth: int = 0) -> Any:
    """An answer's form: its nesting of lists and its leaves' types (an array's by its axes)."""
    if hasattr(x, "shape"):
        return ("array", len(x.shape))
    if isinstance(x, (list, tuple)) and depth < 4:
        return (type(x).__name__, _form(x[0], depth + 1) if len(x) else None)
    return type(x).__name__


def _batch_options(call: Callable[..., Any]) -> dict[str, Any]:
    """What one call over several items needs to run them as a batch: a transformers pipeline
    given a list runs it one text at a time unless it is given a ``batch_size`` (the fix the
    rules write, ``pipe(texts, batch_size=16)``)."""
    owner = getattr(call, "__self__", call)
    pipeline = getattr(sys.modules.get("transformers"), "Pipeline", None)  # (loaded by the user's code, if at all)
    return {"batch_size": MAX_BATCH} if isinstance(pipeline, type) and isinstance(owner, pipeline) else {}


def run_merged(call: Callable[..., Any], calls: list[tuple[tuple[Any, ...], dict[str, Any]]], like: Any = None) -> list[Any]:
    """``call`` run once over every call's inputs, merged along the batch axis, and each
    call's own rows of its output (``like``: one call's answer run alone, whose form each
    answer takes). Raises ``Mismatch`` when the inputs do not line up."""
    # one text per call (encode("a sentence")): a list of one, and its one row back
    single = all(args and isinstance(args[0], str) for args, _ in calls)
    merged_args, rows = merge([(([args[0]],) + args[1:]) if single else args for args, _ in calls])
    merged_kwargs, krows = merge([kwargs for _, kwargs in calls], stack_rows=False)  # (a keyword's number lists are options)
    merged_kwargs = {**_batch_options(call), **merged_kwargs}  # (the caller's own options first)
    rows = rows if any(rows) else krows
    if not any(rows):
        raise Mismatch("no batch axis")
    out = split(call(*merged_args, **merged_kwargs), rows, like=like)
    return [_alone(o, like) for o in out] if single else out


class _Call:
    __slots__ = ("args", "kwargs", "done", "result", "error")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class Batcher:
    """Wraps one bound method: callers that arrive while a call runs are served together.
    A caller waits on one condition until its rows are done or the model is free; the first
    to find it free runs every call waiting then, so nobody queues behind a lock just to
    learn that its rows are ready."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call
        self.pending: list[_Call] = []
        self.cond = threading.Condition()
        self.busy = False
        self.merged = 0  # calls that ran with more than one caller's rows
        self.checked = False
        self.broken = ""
        self.last_size, self.last_s = 1, 0.0
        self.like: Any = None  # a lone call's answer: the form each merged answer takes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        me = _Call(args, kwargs)
        with self.cond:
            self.pending.append(me)
            self.cond.notify_all()  # (a leader waiting for its batch to fill counts arrivals)
            while not me.done and self.busy:
                self.cond.wait()
            batch: list[_Call] = []
            if not me.done:
                self.busy = True
                self._fill()
                # its own call first: a caller that runs the model always runs its own rows
                others = [c for c in self.pending if c is not me]
                batch = [me, *others[: MAX_BATCH - 1]]
                self.pending = others[MAX_BATCH - 1 :]
        if batch:
            t0 = time.perf_counter()
            try:
                self._run(batch)
            finally:
                with self.cond:
                    self.last_size, self.last_s = len(batch), time.perf_counter() - t0
                    self.busy = False
                    self.cond.notify_all()
        if me.error is not None:
            raise me.error
        return me.result

    def _fill(self) -> None:
        """Under load (the last call served several), wait a moment for as many callers as it
        served: those it answered come back together, a few hundred microseconds apart, and
        the first would otherwise run alone. At most half the last call's time (10 ms at most), and
        never at one caller (a lone call never waits)."""
        if self.last_size <= 1:
            return
        deadline = time.perf_counter() + min(0.5 * self.last_s, 0.01)
        while len(self.pending) < self.last_size:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self.cond.wait(left)

    def _run(self, batch: list[_Call]) -> None:
        if len(batch) > 1 and not self.broken and self.like is None:
            # a lone call first: its answer's form tells columns from one entry per input (split)
            self._alone(batch[0])
            batch = batch[1:]
        if len(batch) > 1 and not self.broken:
            try:
                out = run_merged(self.call, [(c.args, c.kwargs) for c in batch], self.like)
                if not self.checked:  # (the first caller's rows and the last's: each its own)
                    self._check(batch[0], out[0])
                    self._check(batch[-1], out[-1])
                for c, o in zip(batch, out):
                    c.result, c.done = o, True
                self.merged += 1
                return
            except Mismatch:
                pass
            except Exception as exc:  # the merged call failed: each caller runs alone, as written
                self.broken = self.broken or f"{type(exc).__name__}: {exc}"[:200]
        for c in batch:
            if not c.done:
                self._alone(c)

    def _alone(self, c: _Call) -> None:
        try:
            c.result = self.call(*c.args, **c.kwargs)
            self.like = c.result if self.like is None else self.like
        except BaseException as exc:  # noqa: B036 - the caller's own failure, handed back to it
            c.error = exc
        c.done = True

    def _check(self, first: _Call, rows: Any) -> None:
        """The first merged call's rows for one caller against that caller's input alone."""
        self.checked = True
        ok, _ = close(plain(self.call(*first.args, **first.kwargs)), plain(rows))
        if not ok:
            self.broken = "a caller's rows of the batched call differ from its input run alone"
            raise Mismatch(self.broken)


def batch_calls(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    conc = ev.concurrent
    if conc is None or conc.forwards is None or conc.concurrency < 2 or conc.forwards.max_batch > 1:
        return None
    if conc.forwards.count * 2 < max(conc.requests, 1):
        return None  # most requests ran no model call of their own: nothing to batch
    words = f"concurrent requests' model calls run as one batch (up to {MAX_BATCH})"
    if conc.forwards.on_event_loop * 2 >= max(conc.requests, 1):
        return WhatIf(fix=words, concurrency=conc.concurrency, why_not="the model runs on the event loop, so concurrent requests never reach it at the same time: move it off the loop first")
    targets = [(obj, method) for fp, (obj, method, _) in seen.owners.items() if fp not in seen.constant]
    targets = list({id(o): (o, m) for o, m in targets}.values())
    if not targets:
        return WhatIf(fix=words, concurrency=conc.concurrency, why_not="the object the model calls went to was not kept (built per request)")
    # one batcher per object for the whole experiment: what it learnt of the load (how many
    # callers come back together) carries from one block to the next, as a server's would
    batchers = [Batcher(getattr(obj, method)) for obj, method in targets]

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for (obj, method), b in zip(targets, batchers):
                patches.method(obj, method, b)
        return patches.undo

    def merged() -> int:
        broken = next((b.broken for b in batchers if b.broken), "")
        if broken:
            from .lab import Abandon

            raise Abandon(f"the calls could not be batched: {broken}")
        return sum(b.merged for b in batchers)

    out = lab.compare(
        Fix("batching", words, apply, hits=merged, no_effect="no two calls ever arrived together with inputs that line up"),
        concurrency=conc.concurrency,
    )
    if out.tried:  # (a lone call never merges: what was checked is the first merged call)
        out.answers = "a merged call's rows were checked against the same input run alone (the first merged call)"
    return out
