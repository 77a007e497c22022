"""The per-request hot path in Python: the twin of ``_speedups.c``, export for export.

``setup``, ``StageBase``, ``stage``/``stage_setup``, ``self_times``, ``TraceBase``/``trace_setup``
and ``fold_rows`` take the same arguments and work on the same data as their C twins: a span is
the list ``[name, start, end, parent, trace, token, child_ns]`` and the current span lives in the
ContextVar given to ``setup``. This module is

- the reference the C code is read against,
- what ``servescope.timing`` runs where the extension is not built, or where
  ``SERVESCOPE_NO_SPEEDUPS=1`` turns it off (timing.py makes that choice, once, at import),
- and, for ``TraceBase.stop``, what the C ``stop`` calls for what it does not handle itself
  (device clocks, stages added by hand, a trace summed before for a header).

tests/conftest.py's ``speedups`` fixture runs the tests that take it over both twins, in process.
"""

from __future__ import annotations

import itertools
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .clocks import total_ns as clock_total_ns

if TYPE_CHECKING:
    from .clocks import Clock
    from .timing import CudaMode

_NAME, _START, _END, _PARENT, _TRACE, _TOKEN, _CHILD = range(7)  # the C enum's order
_OTHER = "other"  # timing.OTHER: where a trace's time in no stage goes

# what setup(), trace_setup() and stage_setup() bind, as they bind the C module's statics
_current: ContextVar[list[Any] | None] = None  # type: ignore[assignment]
_wall_clock: Any = None
_resolve_clock: Callable[[Any, Any], Any] = None  # type: ignore[assignment]
_now: Callable[[], float] = None  # type: ignore[assignment]
_config_error: type[Exception] = None  # type: ignore[assignment]
_shared: dict[str, Any] = {}
_factory: Callable[[object], Any] = None  # type: ignore[assignment]


def setup(current_span_var: ContextVar[list[Any] | None], perf_counter_ns: Callable[[], int]) -> None:
    """setup(current_span_var, perf_counter_ns): bind to timing.py's state. (C reads the wall
    clock itself when a trace's mark is ``perf_counter_ns``; Python always calls the mark.)"""
    global _current
    _current = current_span_var


class StageBase:
    """A stage's enter and exit (servescope.timing.Stage builds on it)."""

    __slots__ = ("name",)

    def __enter__(self) -> Any:
        parent = _current.get()
        if parent is not None:
            tr = parent[_TRACE]
            if tr is not None:
                span = [self.name, tr._mark(), None, parent, tr, None, 0]
                tr._spans.append(span)
                span[_TOKEN] = _current.set(span)
        return self

    def __exit__(self, *exc: object) -> None:
        span = _current.get()
        if span is not None and span[_NAME] is self.name:
            span[_END] = span[_TRACE]._mark()
            _current.reset(span[_TOKEN])


def stage_setup(cache: dict[str, Any], factory: Callable[[object], Any]) -> None:
    """stage_setup(cache, factory): bind to timing.py's stage cache."""
    global _shared, _factory
    _shared, _factory = cache, factory


def stage(name: str) -> Any:
    """Time a block or a function as one stage of the current request.

        with servescope.stage("infer"):
            y = model(x)

        @servescope.stage("preprocess")
        async def prepare(payload): ...

    Outside a trace it records nothing and never fails. Stage objects hold no state (the
    open span lives in the context), so one may be shared, nested and used from many tasks.
    """
    s = _shared.get(name) if type(name) is str else None  # checked before hashing: lists are unhashable
    return s if s is not None else _factory(name)


def self_times(
    spans: list[list[Any]], root: list[Any], release: bool = True
) -> tuple[dict[str, int], int, int]:
    """self_times(spans, root, release=True): stage self times of a wall-clock trace.

    Returns (stage -> self ns of the closed spans, ns the top-level stages cover, how many spans
    are closed). With ``release``, each closed span drops its reference to the trace (at stop:
    a finished trace then holds no cycle and is freed without the garbage collector). Nothing
    else in the spans is left written, so it may run any number of times (mid-request, for a
    header): children's sums build up in their parent's ``child_ns`` field (C keeps them in a
    table of its own), and each is read and set back to 0 when its span is reached.
    """
    out: dict[str, int] = {}
    closed = 0
    # children open after their parent: walking backwards, a span's children are done
    for i in range(len(spans) - 1, -1, -1):
        sp = spans[i]
        below = sp[_CHILD]
        sp[_CHILD] = 0
        end = sp[_END]
        if end is None:
            continue
        closed += 1
        d = end - sp[_START]
        if d < 0:
            d = 0
        sp[_PARENT][_CHILD] += d
        # concurrent children can overlap their parent's whole span: never below zero
        own = d - below
        name = sp[_NAME]
        out[name] = out.get(name, 0) + (own if own > 0 else 0)
        if release:
            sp[_TRACE] = None
    covered = root[_CHILD]
    root[_CHILD] = 0
    return out, covered, closed


def trace_setup(
    wall_clock: Any,
    resolve_clock: Callable[[Any, Any], Any],
    time: Callable[[], float],
    config_error: type[Exception],
    reference_stop: Callable[..., Any],
) -> None:
    """trace_setup(wall_clock, resolve_clock, time, ConfigError, reference_stop): bind to
    timing.py. (``reference_stop`` is this module's own ``TraceBase.stop``: nothing to keep.)"""
    global _wall_clock, _resolve_clock, _now, _config_error
    _wall_clock, _resolve_clock, _now, _config_error = wall_clock, resolve_clock, time, config_error


class TraceBase:
    """A trace's life (servescope.timing.Trace builds on it, and gives it ``_self_times``)."""

    __slots__ = (
        "clock",
        "recorder",
        "_mark",
        "_spans",
        "_root",
        "_token",
        "_added",
        "durations_ns",
        "total_ns",
        "error",
        "start_time",
        "open_stages",
        "_summed",
    )

    def __init__(
        self,
        *,
        cuda: CudaMode = "auto",
        clock: Clock | None = None,
        recorder: Any = None,
    ) -> None:
        if clock is None and cuda == "auto" and "torch" not in sys.modules:
            clock = _wall_clock  # the common CPU case, decided without a call
        self.clock = clock = _resolve_clock(cuda, clock)
        self.recorder = recorder
        self._mark = clock.mark
        self._spans: list[list[Any]] = []
        self._root: list[Any] | None = None
        self._token: Any = None
        self._added: list[tuple[str, int]] = []
        self.durations_ns: dict[str, int] = {}
        self.total_ns: int | None = None
        self.error: str | None = None
        self.start_time: float | None = None
        self.open_stages = 0
        self._summed = False

    def start(self) -> Any:
        """Open the trace in the current context (``with`` does this for you)."""
        if self._root is not None:
            raise _config_error("this trace was already started: open a new servescope.trace() per request")
        self.start_time = _now()
        self._root = [None, self._mark(), None, None, self, None, 0]
        self._token = _current.set(self._root)
        return self

    __enter__ = start

    def stop(self, error: BaseException | None = None) -> Any:
        """End the request's clock now (its response is out), resolve, and hand it to the recorder.

        The trace stays attached to its context until ``detach()``; ``finish()`` does both.
        """
        root = self._root
        if root is None:
            raise _config_error("this trace was never started: use `with servescope.trace():`")
        if root[_END] is not None:
            return self
        root[_END] = self._mark()
        if error is not None and self.error is None:
            self.error = f"{type(error).__name__}: {error}"
        # resolve: stage -> self time, the total, and time in no stage as `other`
        out, covered, n_closed = self._self_times(release=True)  # type: ignore[attr-defined]
        if self.clock.name == "wall":
            total = root[_END] - root[_START]
        else:
            total = clock_total_ns(self.clock, root[_START], root[_END])
        if total < 0:
            total = 0
        self.total_ns = total
        if self._added:
            covered += sum(d for _, d in self._added)
        if total > covered:
            out[_OTHER] = total - covered
        self.durations_ns = out
        self.open_stages = len(self._spans) - n_closed
        if self._token is None:
            root[_TRACE] = None  # break the trace <-> root cycle: freed by refcount, not the GC
        if self.recorder is not None:
            self.recorder.record(self)
        return self

    def detach(self) -> None:
        """Stop stages opened later in this context from landing in this trace."""
        token, self._token = self._token, None
        if token is None:
            return
        try:
            _current.reset(token)
        except ValueError:  # called from another context: that context holds its own value
            pass
        root = self._root
        if root is not None and root[_END] is not None:
            root[_TRACE] = None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)
        token, self._token = self._token, None
        if token is not None:  # detach(), inlined: this is every request's path
            try:
                _current.reset(token)
            except ValueError:
                pass
            self._root[_TRACE] = None  # type: ignore[index]


def fold_rows(rows: list[tuple[dict[str, int], int, str | None, float | None]]) -> tuple[
    bytes, list[tuple[tuple[str, ...], bytes]], list[tuple[int, str]]
]:  # fmt: skip
    """fold_rows(rows) -> (totals, groups, failed): a recorder's rows as float64 ms columns.

    Rows are ``(durations_ns, total_ns, error, start_time)``. ``totals``: the successful rows'
    totals in ms (float64 bytes); ``groups``: for each set of stage names, in dict order and in
    order of first appearance, ``(names, float64 bytes)`` with a row of ms per request and a
    column per name; ``failed``: the failed rows' ``(total_ns, error)``.
    """
    if type(rows) is not list:
        raise TypeError("fold_rows() takes a list of rows")
    ok_totals: list[int] = []
    failed: list[tuple[int, str]] = []
    by_keys: dict[tuple[str, ...], list[Any]] = {}
    for row in rows:
        try:
            durations, total, error, _ = row
        except (TypeError, ValueError):
            durations = None
        if type(durations) is not dict:
            raise TypeError("fold_rows() takes (durations dict, total, error, start) rows")
        if error is not None:
            failed.append((total, error))
            continue
        ok_totals.append(total)
        keys = tuple(durations)
        group = by_keys.get(keys)
        if group is None:
            group = by_keys[keys] = []
        group.append(durations.values())
    totals = np.fromiter(ok_totals, dtype=float, count=len(ok_totals)) / 1e6
    groups = []
    for keys, values in by_keys.items():
        # fromiter with a count: no shape discovery, one pass
        flat = np.fromiter(itertools.chain.from_iterable(values), dtype=float, count=len(values) * len(keys))
        groups.append((keys, (flat / 1e6).tobytes()))
    return totals.tobytes(), groups, failed
