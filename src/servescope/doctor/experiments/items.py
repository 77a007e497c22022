"""A request's items through the model in one call: what ``model.encode(texts)`` would do
where the endpoint runs ``[model.encode(t) for t in texts]``, tried on the endpoint as
written, at one client.

The lab sends the same body in every request, so the calls one request makes are the calls
the next one will make. While applied, the first request's calls to the model object are
recorded (and run as written); from the next request on, the first of them runs every
recorded input as one call, merged along the batch axis as the batching experiment merges
concurrent callers' (batching.py), and each call after it that brings the next recorded
input is answered with its own rows. A call that brings anything else runs as written.
Token ids of other lengths (each text tokenized alone) are padded to the longest where each
call's attention mask hides the padding, and each call's outputs cut back to its length.
The first merged call's rows are checked against their inputs run alone; inputs that do
not line up (other options: a decoder's steps, each with its cache), and calls that take an
earlier call's output, are not merged, and the fix is not tried.

Whether they do is tested, not guessed: after the learnt request comes one for each model
object whose answers hold floats, in which that object's answers are given back scaled by
``NUDGE`` (its calls run as written). A later call to it whose input then differs from the
learnt one takes something computed from an earlier answer (``x = model(x) * 2``, a forecast's
window scaled with its predictions in it, a loop that stops sooner): the calls depend on each
other. Those requests' answers are the doctor's own and are not compared. Beside that, an
answer's numbers met again in later inputs (``x = model(x)`` with an integer answer that the
nudge may not move) say the same.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from ..context import current_evidence
from ..evidence import ONE_CALL_EACH, Evidence, WhatIf
from ..inputs import fingerprint, leaves
from .answers import close, plain
from .batching import Mismatch, run_merged
from .forward import is_seq, map_tensors, mask_of
from .lab import Abandon, Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["batch_items"]

#: most items merged into one call (the request's calls beyond run as written)
MAX_ITEMS = 256

WORDS = "the request's items run through the model in one call"
#: why the items were not merged: each call took an earlier one's output
DEPENDENT = "a call's input holds an earlier call's output (a loop that feeds its answer back): the calls depend on each other"
#: ... found by changing its answers
NUDGED = ("a later call's input changed when the doctor scaled the model's answers by 1.125 in one request (a loop that feeds "
          "its answers back, as a recursive forecast does): the calls depend on each other")  # fmt: skip
#: ... or not known, as the inputs differ anyway
VARY = "the calls' inputs differ from one request to the next with the same body, so they could not be learnt"
#: what a float answer is scaled by in a nudged request: a change no float noise makes, that
#: rounding to a whole number still shows for answers above about 8
NUDGE = 1.125


class Items:
    """Wraps one bound method for the experiment: learns a request's calls, then runs them as one."""

    def __init__(self, call: Callable[..., Any], inputs_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
        self.call, self.inputs_of = call, inputs_of
        self.plan: list[tuple[str | None, tuple[Any, ...], dict[str, Any]]] = []
        self.learning = True
        self.request: Any = None  # the evidence record of the request the last call was made for
        self.rows: list[Any] = []
        self.at = 0
        self.merged = 0  # merged calls run
        self.broken = ""
        self.outputs: set[str] = set()  # the learnt request's outputs, array by array
        self.values: set[float] = set()  # ... and the distinctive numbers in them
        self.fed = 0  # the learnt calls whose input held one of those numbers
        self.like: Any = None  # the first call's answer: the form each merged answer takes
        self.learnt = 0  # the learnt request's calls (the plan keeps MAX_ITEMS of them)
        self.nudgeable = False  # some answer of the learnt request held a float to scale
        self.stage = ""  # "nudge": its answers scaled, its inputs checked; "aside": as written
        self.strayed = ""  # how the nudged request's calls strayed from the plan
        self.lock = threading.Lock()

    def trial(self, nudge: bool) -> None:
        """A request for the dependency test: this object's answers scaled (``nudge``) or run as
        written while another object's are. Ends the learning."""
        with self.lock:
            self._learnt()
            self.stage, self.at = ("nudge" if nudge else "aside"), 0

    def trial_over(self) -> None:
        with self.lock:
            if self.stage == "nudge" and not self.broken and (self.strayed or self.at < self.learnt):
                self.broken = self.strayed or NUDGED  # (a loop that stopped sooner)
            self.stage, self.rows, self.at = "", [], 0

    def _learnt(self) -> None:
        if self.learning and self.fed >= max(FED_CALLS, (len(self.plan) - 1) // 2):
            self.broken = DEPENDENT  # (step after step took a number of an answer before it)
        self.learning = False

    def _new_request(self, fp: str | None) -> bool:
        """Is this call the first of another request? By the request's own record where the
        call runs in one (every request the doctor sends has its own), else by its input."""
        req = current_evidence()
        if req is not None:
            new, self.request = req is not self.request, req
            return new and bool(self.plan)
        return bool(self.plan) and fp is not None and fp == self.plan[0][0] and (self.learning or self.at >= len(self.rows))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fp = fingerprint(self.inputs_of(args, kwargs))
        with self.lock:
            if self.stage:
                return self._trial_call(fp, args, kwargs)
            new = self._new_request(fp)
            if self.learning and not new:
                if _prints((args, kwargs)) & self.outputs:
                    self.broken = DEPENDENT  # (an earlier call's output array itself)
                elif _values((args, kwargs)) & self.values:
                    self.fed += 1
                out = self.call(*args, **kwargs)
                if not self.plan:
                    self.like = out
                self.learnt += 1
                self.nudgeable = self.nudgeable or _nudged(out)[1]
                if len(self.plan) < MAX_ITEMS:
                    self.plan.append((fp, args, kwargs))
                    self.outputs |= _prints(out)
                    self.values |= _values(out)
                return out
            self._learnt()  # the first call of the next request: the plan is whole
            if self.broken or fp is None:
                return self.call(*args, **kwargs)
            if not new and self.at < len(self.rows) and fp == self.plan[self.at][0]:
                self.at += 1
                return self.rows[self.at - 1]
            if not new or fp != self.plan[0][0] or len(self.plan) < 2:
                self.rows, self.at = [], 0  # (a request that strays from the plan runs as written to its end)
                return self.call(*args, **kwargs)
            return self._merged(args, kwargs)

    def _trial_call(self, fp: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = self.call(*args, **kwargs)
        if self.stage != "nudge":
            return out
        if not self.strayed and self.at < len(self.plan) and fp != self.plan[self.at][0]:
            self.strayed = NUDGED if self.at else VARY  # (nothing was scaled before a request's first call)
        elif not self.strayed and self.at >= self.learnt:
            self.strayed = NUDGED  # (more calls than the learnt request made)
        self.at += 1
        return _nudged(out)[0]

    def _merged(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls = [(a, k) for _, a, k in self.plan]
        try:
            try:
                rows = run_merged(self.call, calls, self.like)
            except Mismatch:
                rows = _padded(self.call, calls)  # (texts tokenized one by one: lengths differ)
        except Mismatch as exc:
            self.broken = f"the items' inputs do not line up in one call ({exc})"
            return self.call(*args, **kwargs)
        except Exception as exc:  # the merged call failed: the endpoint runs as written
            self.broken = f"the merged call failed ({type(exc).__name__}: {exc})"[:200]
            return self.call(*args, **kwargs)
        if not self.merged:  # (the first, the middle and the last item: the shortest is padded most)
            for i in sorted({0, len(rows) // 2, len(rows) - 1}):
                _, a, k = self.plan[i]
                if not close(plain(self.call(*a, **k)), plain(rows[i]))[0]:
                    self.broken = "an item's rows of the merged call differ from its input run alone"
                    return self.call(*args, **kwargs)
        self.merged += 1
        self.rows, self.at = rows, 1
        return rows[0]


def _padded(call: Callable[..., Any], calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
    """``run_merged`` over calls whose sequences differ in length, as a tokenizer pads a list
    of texts: each call's sequence tensors (those as long as its attention mask) padded with
    zeros on the right to the longest, where its mask hides them, and each call's outputs cut
    back to its own length. Raises ``Mismatch`` where a call carries no attention mask."""
    lengths = []
    for args, kwargs in calls:
        mask = mask_of(args, kwargs)
        if mask is None or mask.dim() != 2:
            raise Mismatch("different shapes, and no attention mask to pad them by")
        lengths.append(int(mask.shape[1]))
    longest, torch = max(lengths), sys.modules["torch"]  # (a mask with .dim(): torch is loaded)

    def pad(length: int) -> Callable[[Any], Any]:
        def one(t: Any) -> Any:
            if length == longest or not is_seq(torch, t, length):
                return t
            full = t.new_zeros((t.shape[0], longest, *t.shape[2:]))
            full[:, :length] = t
            return full

        return one

    padded = [(map_tensors(a, pad(n)), map_tensors(k, pad(n))) for (a, k), n in zip(calls, lengths)]
    rows = run_merged(call, padded)
    cut = lambda n: lambda t: t[:, :n] if is_seq(torch, t, longest) else t  # noqa: E731
    return [map_tensors(r, cut(n)) for r, n in zip(rows, lengths)]


def _nudged(obj: Any) -> tuple[Any, bool]:
    """``obj`` with its float arrays, tensors and numbers scaled by ``NUDGE`` (new objects,
    dict and tuple types kept), and whether any was."""
    hit = [False]

    def one(x: Any) -> Any:
        mod = type(x).__module__
        if isinstance(x, float) or (mod == "numpy" and getattr(getattr(x, "dtype", None), "kind", "") == "f"):
            hit[0] = True
            return x * NUDGE
        if (mod == "torch" or mod.startswith("torch.")) and hasattr(x, "is_floating_point") and x.is_floating_point():
            hit[0] = True
            return x * NUDGE
        return x

    out = map_tensors(obj, one)
    return out, hit[0]


def _prints(obj: Any) -> set[str]:
    """A fingerprint of each array in ``obj``."""
    return {p for _, leaf in leaves(obj) if (p := fingerprint(leaf)) is not None}


#: numbers read from a call's inputs or answer: the first and the last half of them from each
#: array (a forecast's window ends with its newest value), and this many in all
VALUES_PER_CALL = 4096
#: a loop that feeds its answers back does so at every step: this many of a request's calls
#: (and half of those after the first) must hold a number of an earlier answer, as one
#: number that matches by chance must not decide it
FED_CALLS = 2


def _values(obj: Any) -> set[float]:
    """The distinctive numbers in ``obj``: floats of 24 bits of mantissa or more with more
    than four decimals (a model's answer, not a feature like 0.5 or 3.25, nor one of the few
    values a half-precision pixel can take), from float arrays, CPU tensors, pandas frames and
    lists of numbers. A call whose input holds one of an earlier call's answers (a forecast
    whose next window ends with the last prediction) may depend on it. Never raises: what
    cannot be read adds nothing."""
    out: set[float] = set()
    try:
        _gather(obj, out, 0, [4 * VALUES_PER_CALL])
    except Exception:  # noqa: BLE001 - an exotic array type: read what could be read
        pass
    return out


def _gather(obj: Any, out: set[float], depth: int, left: list[int]) -> None:
    """Into ``out``, the distinctive numbers of ``obj``; ``left``: the objects still to visit."""
    left[0] -= 1
    if depth > 4 or len(out) >= VALUES_PER_CALL or left[0] < 0:
        return
    mod = type(obj).__module__
    arr: Any = None
    if mod == "torch" or mod.startswith("torch."):
        if hasattr(obj, "is_floating_point") and obj.is_floating_point() and obj.device.type == "cpu" and obj.element_size() >= 4:
            arr = obj.detach().reshape(-1)
    elif mod.startswith("pandas") and hasattr(obj, "to_numpy"):
        num = obj.select_dtypes("number") if hasattr(obj, "select_dtypes") else obj
        arr = num.to_numpy().reshape(-1)
    elif hasattr(obj, "dtype") and hasattr(obj, "reshape"):
        arr = obj.reshape(-1)
    elif isinstance(obj, float):
        _keep([obj], out)
    elif isinstance(obj, dict):
        for v in list(obj.values())[:64]:
            _gather(v, out, depth + 1, left)
    elif isinstance(obj, (list, tuple)):
        half = VALUES_PER_CALL // 2
        for v in (obj if len(obj) <= 2 * half else [*obj[:half], *obj[-half:]]):
            _gather(v, out, depth + 1, left)
    if arr is None:
        return
    dtype = getattr(arr, "dtype", None)
    if mod.startswith(("numpy", "pandas")) and (getattr(dtype, "kind", "") != "f" or dtype.itemsize < 4):
        return
    half = VALUES_PER_CALL // 2
    n = int(arr.shape[0])
    _keep(arr.tolist() if n <= 2 * half else [*arr[:half].tolist(), *arr[-half:].tolist()], out)


def _keep(values: list[Any], out: set[float]) -> None:
    out.update(v for v in values if isinstance(v, float) and v == v and v != round(v, 4))


def batch_items(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or warm.forwards.per_request < 2 or warm.forwards.max_batch > 1:
        return None
    if warm.first_chunk_p50_ms is not None or warm.recompute_steps_per_request >= 1:
        return None  # a streamed or decoded answer: its steps depend on each other
    targets = [(obj, method, inputs_of) for fp, (obj, method, inputs_of) in seen.owners.items() if fp not in seen.constant]
    targets = list({id(o): (o, m, i) for o, m, i in targets}.values())
    if not targets:
        return WhatIf(fix=WORDS, why_not="no model object the calls went to was kept (a model built per request, or inputs the doctor "
                      "cannot tell apart: on a GPU, or with no array or text)")  # fmt: skip
    wrappers = [Items(getattr(obj, method), inputs_of) for obj, method, inputs_of in targets]
    applied, turns = [0], []

    def apply() -> Callable[[], None]:
        # each primed request applies the fix once: the first learns, then one request for each
        # object whose answers can be scaled tests whether its calls feed each other
        applied[0] += 1
        if applied[0] == 2:
            turns.extend(w for w in wrappers if w.nudgeable and not w.broken)
        if 2 <= applied[0] < 2 + len(turns):
            for w in wrappers:
                w.trial(nudge=w is turns[applied[0] - 2])
        elif turns and applied[0] == 2 + len(turns):
            for w in wrappers:
                w.trial_over()
        with patching() as patches:
            for (obj, method, _), w in zip(targets, wrappers):
                patches.method(obj, method, w)
        return patches.undo

    def merged() -> int:
        done = sum(w.merged for w in wrappers)
        if not done and not any(w.plan for w in wrappers):
            raise Abandon(f"no call reached the model objects' own methods ({', '.join(sorted({m for _, m, _ in targets}))}): "
                          "the endpoint calls them through a reference kept before (`encode = model.encode`), or calls other objects now")  # fmt: skip
        if not done and all(len(w.plan) < 2 for w in wrappers):
            raise Abandon(ONE_CALL_EACH)
        broken = next((w.broken for w in wrappers if w.broken), "")
        if broken and not done:
            raise Abandon(f"the items could not be run as one call: {broken}")
        return done

    # (uncounted requests first: one to learn the calls, one a model object to test whether they
    # depend on each other, and one whose first merged call is checked)
    nudging = lambda: any(w.stage == "nudge" for w in wrappers)  # noqa: E731
    return lab.compare(Fix("batch-items", WORDS, apply, hits=merged, prime=2 + len(wrappers), altered=nudging))
