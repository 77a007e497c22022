"""Stage timers: where one request's time goes.

    import servescope

    with servescope.trace() as t:                 # one request
        with servescope.stage("preprocess"):
            x = prepare(payload)
        with servescope.stage("infer"):
            y = model(x)
    print(t.durations_ms)                         # {"preprocess": 1.9, "infer": 3.2}

The open trace travels in a ``contextvars`` variable, so helpers, threads started with
``contextvars.copy_context()`` (or ``asyncio.to_thread``) and asyncio tasks land in the right
request. Outside a trace, a stage only reads that variable.

Stages nest: a stage's duration is its *self* time (time spent inside it minus the time of
stages opened inside it), so the durations of one trace add up to at most its total.
Time spent in no stage is reported as ``other``.

On a GPU, host clocks lie: CUDA kernels are queued, so a host timer around ``model(x)``
measures the launch and the kernel time lands in the first stage that synchronises.
``trace(cuda="events")`` records a CUDA event at each boundary and reads them once at the end
of the request (no sync mid-request); ``cuda="sync"`` synchronises at each boundary (what
hand-written guides do: right, but it stalls the pipeline). ``cuda="auto"`` (the default)
picks ``events`` once CUDA is initialised in the process and plain host clocks otherwise.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import time
from contextvars import ContextVar
from types import ModuleType
from typing import Any, Callable, Literal, TypeVar

from . import _speedups_py
from .clocks import _WALL, Clock, CudaEventClock, SyncClock, WallClock, resolve_clock
from .exceptions import ConfigError, RecordError, StageError

__all__ = [
    "CANONICAL_STAGES",
    "STAGE_ORDER",
    "Clock",
    "CudaEventClock",
    "SyncClock",
    "Stage",
    "Trace",
    "WallClock",
    "carried",
    "current_stage_name",
    "current_trace",
    "stage",
    "trace",
]

#: The request's path, in order.
CANONICAL_STAGES = (
    "receive",
    "validate",
    "preprocess",
    "to_device",
    "infer",
    "to_host",
    "postprocess",
    "serialize",
    "send",
)
#: The order reports use: model loading and queueing first, then the request's path.
STAGE_ORDER = ("load", "queue", *CANONICAL_STAGES)
#: The name under which a trace's time spent outside every stage is reported.
OTHER = "other"

CudaMode = Literal["auto", "events", "sync", "wall"]
F = TypeVar("F", bound=Callable[..., Any])


_RANK = {name: i for i, name in enumerate(STAGE_ORDER)}
_ORDER_CACHE: dict[tuple[str, ...], list[str]] = {}


def order_stages(names: Any) -> list[str]:
    """Stage names in report order (canonical first, then in the order given, ``other`` last)."""
    key = tuple(names)
    cached = _ORDER_CACHE.get(key)
    if cached is not None:  # requests of one endpoint see the same few stage sets
        return cached
    unique = list(dict.fromkeys(key))
    n = len(_RANK)
    rank = {name: _RANK.get(name, n + i) for i, name in enumerate(unique)}
    rank[OTHER] = n + len(unique)
    ordered = sorted(unique, key=rank.__getitem__)
    if len(_ORDER_CACHE) > 1024:
        _ORDER_CACHE.clear()
    _ORDER_CACHE[key] = ordered
    return ordered


# ---------------------------------------------------------------------------------------------
# Spans and traces.
#
# An open span is a list [name, start, end, parent, trace, token, child_ns]: lists are the
# cheapest mutable record in CPython, and this is the hot path. The current span (the trace's
# root when no stage is open) lives in one ContextVar; stage objects are shared per name and
# keep no state, so `stage("infer")` allocates nothing but the span.

_NAME, _START, _END, _PARENT, _TRACE, _TOKEN, _CHILD = range(7)
_current: ContextVar[list[Any] | None] = ContextVar("servescope_current_span", default=None)


def current_trace() -> Trace | None:
    """The trace open in this context, or ``None``."""
    span = _current.get()
    return None if span is None else span[_TRACE]


def current_stage_name() -> str | None:
    """The innermost stage open in this context: ``None`` outside a trace, ``""`` in a trace
    with no stage open. What a probe checks so that a call nested in its own stage
    (recursion) is not timed twice."""
    span = _current.get()
    if span is None:
        return None
    return span[_NAME] or ""


def carried(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, to be run on another thread inside the trace (and stage) open here, so its
    stages land in this request. ``asyncio.to_thread`` copies the whole context for you;
    this carries only servescope's own, for hand-offs that copy nothing (an executor's
    ``submit``, ``loop.run_in_executor``)."""
    span = _current.get()
    if span is None:
        return fn

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _current.set(span)
        try:
            return fn(*args, **kwargs)
        finally:
            _current.reset(token)

    return run


def _bad_name(name: object) -> StageError:
    return StageError(
        f"a stage name must be a non-empty string, got {name!r}; "
        f"use one of {', '.join(STAGE_ORDER)} or a name of your own"
    )


# ---------------------------------------------------------------------------------------------
# The twins. A stage's enter and exit, a trace's life and the self-time pass have two
# implementations with the same exports, working on the same spans: _speedups.c (C, built at
# install where a compiler exists) and _speedups_py.py (Python: the reference and the fallback).
# Stage and Trace are one twin's bases plus the Python below. The twin is chosen here, once.


def _load_speedups() -> ModuleType:
    if os.environ.get("SERVESCOPE_NO_SPEEDUPS"):  # the user's off switch, read once, here
        return _speedups_py
    try:
        from . import _speedups
    except ImportError:  # not built (no C compiler at install time): the same, in Python
        return _speedups_py
    return _speedups


_twin = _load_speedups()
#: True when stages and traces run in C: the ``_speedups`` extension was built and
#: ``SERVESCOPE_NO_SPEEDUPS`` did not turn it off
SPEEDUPS = _twin is not _speedups_py


def _bind(twin: ModuleType) -> None:
    """Give a twin this module's state: the current span's ContextVar, the clocks, the error."""
    twin.setup(_current, time.perf_counter_ns)
    twin.trace_setup(_WALL, resolve_clock, time.time, ConfigError, _speedups_py.TraceBase.stop)


_bind(_speedups_py)  # whichever runs: the C stop hands what it does not handle to this one's stop
if SPEEDUPS:
    _bind(_twin)


class Stage(_twin.StageBase):  # type: ignore[misc,name-defined]
    """A named stage: a context manager and a decorator. Get one with ``servescope.stage(name)``."""

    __slots__ = ()  # over the twin's StageBase, which enters and exits

    def __init__(self, name: str) -> None:
        if type(name) is not str or not name:
            raise _bad_name(name)
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # pickled (Ray, multiprocessing): the shared one
        return _shared_stage, (self.name,)

    async def __aenter__(self) -> Stage:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def __call__(self, fn: F) -> F:
        # a generator's body runs a piece at each next(): time each piece (summed under the
        # stage's name), never the caller's time between items (a streamed response)
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def async_generator_wrapper(*args: Any, **kwargs: Any) -> Any:
                agen = fn(*args, **kwargs)
                sent: Any = None
                thrown: BaseException | None = None
                try:
                    while True:
                        with self:
                            try:
                                if thrown is None:
                                    item = await agen.asend(sent)
                                else:
                                    item, thrown = await agen.athrow(thrown), None
                            except StopAsyncIteration:
                                return
                        try:
                            sent = yield item
                        except GeneratorExit:
                            raise
                        except BaseException as exc:  # athrow(): the generator decides
                            thrown, sent = exc, None
                finally:
                    if agen.ag_frame is not None:  # left early: its clean-up is its work too
                        with self:
                            await agen.aclose()

            return async_generator_wrapper  # type: ignore[return-value]

        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator_wrapper(*args: Any, **kwargs: Any) -> Any:
                gen = fn(*args, **kwargs)
                sent: Any = None
                thrown: BaseException | None = None
                try:
                    while True:
                        with self:
                            try:
                                if thrown is None:
                                    item = gen.send(sent)
                                else:
                                    item, thrown = gen.throw(thrown), None
                            except StopIteration as stop:
                                return stop.value
                        try:
                            sent = yield item
                        except GeneratorExit:
                            raise
                        except BaseException as exc:  # throw(): the generator decides
                            thrown, sent = exc, None
                finally:
                    if gen.gi_frame is not None:  # left early: its clean-up is its work too
                        with self:
                            gen.close()

            return generator_wrapper  # type: ignore[return-value]

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        if not callable(fn):
            raise StageError(f"stage({self.name!r}) decorates a function, got {fn!r}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"stage({self.name!r})"


def _shared_stage(name: str) -> Stage:
    """Unpickling: the process's shared stage of that name (by reference to this module, so a
    process without the C extension can read it)."""
    return stage(name)


#: Stage objects shared per name, up to this many names (a name made per request,
#: ``stage(f"infer_{id}")``, still works, uncached: the cache must not grow without bound)
_MAX_SHARED = 4096


def _stage_maker(stage_cls: type[Stage], shared: dict[str, Stage]) -> Callable[[object], Stage]:
    """What a twin's ``stage(name)`` calls for a name not in ``shared``: check the name, make
    the stage, and share it."""

    def new_stage(name: object) -> Stage:
        if type(name) is not str or not name:
            raise _bad_name(name)
        s = stage_cls(name)
        if len(shared) < _MAX_SHARED:
            shared[name] = s
        return s

    return new_stage


_STAGES: dict[str, Stage] = {}
_twin.stage_setup(_STAGES, _stage_maker(Stage, _STAGES))
#: ``servescope.stage(name)``: time a block or a function as one stage of the current request
#: (``with stage("infer"): ...``, ``@stage("preprocess")``); a shared ``Stage`` per name, looked
#: up by the twin (one dict read). Outside a trace it records nothing and never fails.
stage: Callable[[str], Stage] = _twin.stage


class Trace(_twin.TraceBase):  # type: ignore[misc,name-defined]
    """One request's stages. Use ``servescope.trace()`` to open one:
    ``trace(*, cuda="auto", clock=None, recorder=None)``.

    After the trace closes: ``durations_ms`` (stage -> self time, report order, ``other`` for
    time outside every stage), ``total_ms``, ``error`` (``"TypeName: message"`` when the block
    raised) and ``start_time`` (epoch seconds).
    """

    __slots__ = ()  # the twin's TraceBase starts, stops and detaches it (its stop reads _self_times)
    _wall_self_times = staticmethod(_twin.self_times)  # the same twin's self-time pass
    # the C __init__ has no signature of its own: help() and IDEs read the Python twin's
    __signature__ = inspect.Signature(
        list(inspect.signature(_speedups_py.TraceBase.__init__).parameters.values())[1:]
    )

    def finish(self, error: BaseException | None = None) -> Trace:
        """Close the trace: ``stop()`` then ``detach()``."""
        self.__exit__(None, error, None)
        return self

    async def __aenter__(self) -> Trace:
        return self.start()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(exc)

    # -- adding time measured elsewhere ------------------------------------------------------
    def add(self, name: str, duration_ms: float) -> None:
        """Add a stage measured elsewhere (a batcher's queue wait, a parsed Server-Timing entry).

        It counts in ``durations_ms`` and comes out of the trace's unstaged time (``other``).
        """
        if type(name) is not str or not name:
            raise _bad_name(name)
        if not isinstance(duration_ms, (int, float)) or not math.isfinite(duration_ms) or duration_ms < 0:
            raise RecordError(
                f"stage {name!r}: a duration must be a finite number of milliseconds >= 0, "
                f"got {duration_ms!r}"
            )
        ns = round(duration_ms * 1e6)
        if self.total_ns is None:
            self._added.append((name, ns))
        else:  # already resolved: add straight to the result
            self.durations_ns[name] = self.durations_ns.get(name, 0) + ns

    def fail(self, error: BaseException | str) -> None:
        """Mark the request as failed (the report keeps failures apart from successes)."""
        self.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

    # -- results -----------------------------------------------------------------------------
    def _closed_ns(self) -> tuple[list[list[Any]], list[int], list[int]]:
        """The closed spans, with their start and end in ns since the trace began."""
        root = self._root
        assert root is not None  # guarded by the callers
        closed = [sp for sp in self._spans if sp[_END] is not None]
        if self.clock.name == "wall":
            base = root[_START]
            return closed, [sp[_START] - base for sp in closed], [sp[_END] - base for sp in closed]
        marks = []
        for sp in closed:
            marks += (sp[_START], sp[_END])
        ns = self.clock.resolve(root[_START], marks)
        return closed, ns[0::2], ns[1::2]

    def _self_times(self, *, release: bool = False) -> tuple[dict[str, int], int, int]:
        """Stage -> self time (ns) of the closed spans, the time top-level stages cover, and
        how many spans are closed.

        ``release`` drops each closed span's reference to the trace (at stop), so a finished
        trace holds no reference cycle and is freed without the garbage collector.
        """
        root = self._root
        assert root is not None  # guarded by the callers
        if self.clock.name == "wall":  # marks are ns already: the twin's pass (it writes no sums)
            out, covered, n_closed = self._wall_self_times(self._spans, root, release)
            for name, d in self._added:
                out[name] = out.get(name, 0) + d
            return out, covered, n_closed
        # a device clock: the same pass over marks resolved to ns (once), summing in the spans
        if not release or self._summed:  # a header summed them before: start again from zero
            root[_CHILD] = 0
            for sp in self._spans:
                sp[_CHILD] = 0
        self._summed = not release
        closed, starts, ends = self._closed_ns()
        out = {}
        # children open after their parent: walking backwards, a span's children are done
        for i in range(len(closed) - 1, -1, -1):
            sp = closed[i]
            d = ends[i] - starts[i]
            if d < 0:
                d = 0
            sp[_PARENT][_CHILD] += d
            # concurrent children can overlap their parent's whole span: never below zero
            own = d - sp[_CHILD]
            name = sp[_NAME]
            out[name] = out.get(name, 0) + (own if own > 0 else 0)
            if release:
                sp[_TRACE] = None
        for name, d in self._added:
            out[name] = out.get(name, 0) + d
        return out, root[_CHILD], len(closed)

    def elapsed_ns(self) -> tuple[dict[str, int], int | None]:
        """Stage -> ns so far (closed stages only) and the time since the trace began (None on
        a device clock, which cannot be read without a sync): for a header sent mid-request."""
        if self.total_ns is not None:
            return self.durations_ns, self.total_ns
        root = self._root
        if root is None:
            return {}, None
        out, _, _ = self._self_times()
        now = self._mark() - root[_START] if self.clock.name == "wall" else None
        return out, now

    def spans(self) -> list[tuple[str, float, float, int]]:
        """Each closed stage as ``(name, start_ms, end_ms, depth)`` since the trace began."""
        if self._root is None:
            return []
        closed, starts, ends = self._closed_ns()
        depth: dict[int, int] = {id(self._root): -1}
        out = []
        for sp, st, en in zip(closed, starts, ends):
            d = depth.get(id(sp[_PARENT]), -1) + 1
            depth[id(sp)] = d
            out.append((sp[_NAME], st / 1e6, en / 1e6, d))
        return out

    @property
    def durations_ms(self) -> dict[str, float]:
        """Stage -> milliseconds, in report order."""
        d = self.durations_ns
        return {k: d[k] / 1e6 for k in order_stages(d)}

    @property
    def started_ns(self) -> int | None:
        """The trace's first mark on the host clock (``perf_counter_ns``), for a wall clock."""
        if self._root is None or self.clock.name != "wall":
            return None
        return self._root[_START]

    @property
    def total_ms(self) -> float | None:
        return None if self.total_ns is None else self.total_ns / 1e6

    def __repr__(self) -> str:
        if self.total_ns is None:
            return f"<Trace open clock={self.clock.name}>"
        stages = ", ".join(f"{k}={v:.3f}" for k, v in self.durations_ms.items())
        return f"<Trace total={self.total_ns / 1e6:.3f}ms {stages}>"


#: ``servescope.trace(cuda=..., clock=..., recorder=...)`` opens a trace for one request:
#: ``with servescope.trace() as t: ...`` (the class itself: one call less per request).
trace = Trace


_TwinAPI = tuple[type[Stage], type[Trace], Callable[[str], Stage], dict[str, Stage]]
_OTHER_TWIN_API: dict[str, _TwinAPI] = {}


def _twin_api(twin: ModuleType) -> _TwinAPI:
    """``Stage``, ``Trace``, ``stage`` and its shared stages over one twin (``_speedups`` or
    ``_speedups_py``): this module's own for the twin in use; for the other, made at the first
    call (the same class bodies, over its bases), so that tests hold both twins to the same
    behaviour in one process."""
    if twin is _twin:
        return Stage, Trace, stage, _STAGES
    made = _OTHER_TWIN_API.get(twin.__name__)
    if made is None:
        _bind(twin)
        stage_cls = type("Stage", (twin.StageBase,), dict(Stage.__dict__))
        trace_body = {**Trace.__dict__, "_wall_self_times": staticmethod(twin.self_times)}
        trace_cls = type("Trace", (twin.TraceBase,), trace_body)
        shared: dict[str, Stage] = {}
        twin.stage_setup(shared, _stage_maker(stage_cls, shared))
        made = _OTHER_TWIN_API[twin.__name__] = (stage_cls, trace_cls, twin.stage, shared)
    return made
