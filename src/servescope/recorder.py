"""The recorder: finished traces in, per-stage distributions out, one ``Report`` at the end."""

from __future__ import annotations

import collections
import logging
import math
import threading
from typing import Any, Mapping

import numpy as np

from .exceptions import ConfigError, RecordError
from .report import Report
from .sections import Streaming
from .stats import Distribution
from .timing import OTHER, SPEEDUPS, STAGE_ORDER, Trace

if SPEEDUPS:  # timing.py chose the twin (the C extension, or its Python twin): fold with the same
    from ._speedups import fold_rows
else:
    from ._speedups_py import fold_rows

__all__ = ["MORE_STAGES", "Recorder"]

_FOLD_EVERY = 1024
log = logging.getLogger("servescope")

#: Where stage names past a recorder's (or exporter's) ``max_stage_names`` are counted together.
MORE_STAGES = "(more stages)"
_ALWAYS_KEPT = frozenset((*STAGE_ORDER, OTHER, MORE_STAGES))


class StageNames:
    """Which stage names a sink keeps apart: the canonical ones, ``other``, and up to ``limit``
    names of the user's own. Past that, new names count together as ``MORE_STAGES`` (stage
    names are meant to be a fixed set: a name made per request, ``f"infer_{id}"``, would
    otherwise grow memory without bound), with one warning that shows a few of them."""

    def __init__(self, limit: int, sink: str) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError(f"max_stage_names must be an integer >= 0, got {limit!r}")
        self.limit = limit
        self.sink = sink
        self.kept: set[str] = set()  # the user's own names kept apart (at most limit)
        self.folded: list[str] = []  # the first few names counted as MORE_STAGES

    def admit(self, name: str) -> bool:
        """Keep this name apart (True), or count it under ``MORE_STAGES`` (False)."""
        if name in _ALWAYS_KEPT or name in self.kept:
            return True
        if len(self.kept) < self.limit:
            self.kept.add(name)
            return True
        if len(self.folded) < 5 and name not in self.folded:
            self.folded.append(name)
            if len(self.folded) == 1:
                log.warning(
                    "servescope: %s keeps %d stage names of your own apart; later ones (first: %r) are "
                    "counted together as %r. Stage names should be a fixed set: put ids elsewhere, "
                    "or raise max_stage_names.",
                    self.sink, self.limit, name, MORE_STAGES,
                )  # fmt: skip
        return False

    def summary(self) -> dict[str, Any] | None:
        """For a report: the limit and the first names folded, or None when none was."""
        return {"limit": self.limit, "examples": list(self.folded), "into": MORE_STAGES} if self.folded else None


Row = tuple[dict[str, int], int, "str | None", "float | None"]


def _columns(rows: list[Row]) -> tuple[np.ndarray, list[tuple[tuple[str, ...], np.ndarray]], list[tuple[int, str]]]:
    """Rows -> the successful totals (ms), per set of stage names a (request x stage) array of
    ms, and the failed rows' (total ns, error): the twin's ``fold_rows``, as arrays."""
    totals, groups, failed = fold_rows(rows)
    return (
        np.frombuffer(totals),
        # requests that ran no stage (keys ()): nothing to add to any stage
        [(keys, np.frombuffer(buf).reshape(-1, len(keys))) for keys, buf in groups if keys],
        failed,
    )


class Recorder:
    """Collects requests' stage durations.

        rec = servescope.Recorder()
        with servescope.trace(recorder=rec):
            ...
        rec.report().save("run.json")

    Successful requests feed ``latency`` and the stage distributions; failed ones (a trace
    whose block raised, or marked with ``trace.fail``) are counted by kind with their own
    latency distribution, never mixed with successes. The very first request is kept apart
    as ``first_ms`` (cold start) and also counted. ``keep_samples`` per-request rows are kept
    for the report (the first ones); distributions stay exact up to ``exact_limit`` samples,
    then become a sketch with bounded memory.
    """

    def __init__(
        self,
        *,
        exact_limit: int = 100_000,
        keep_samples: int = 10_000,
        deltas: bool = False,
        max_stage_names: int = 256,
    ) -> None:
        self.exact_limit = exact_limit
        self._names = StageNames(max_stage_names, "this Recorder")
        self.keep_samples = keep_samples
        self._latency = Distribution(exact_limit=exact_limit)
        self._error_latency = Distribution(exact_limit=exact_limit)
        self._stages: dict[str, Distribution] = {}
        self.errors: dict[str, int] = {}
        self.first_ms: float | None = None
        self._sample_rows: list[tuple[dict[str, int], int, str | None, float | None]] = []
        # a deque: appends from any thread are atomic, and _fold drains by count, so a request
        # recorded while a fold runs is never lost
        self._pending: collections.deque[tuple[dict[str, int], int, str | None, float | None]] = collections.deque()
        self._lock = threading.Lock()
        # rows folded since the last take_delta(), kept only when asked (replicas shipping deltas)
        self._unsent: list[tuple[dict[str, int], int, str | None, float | None]] | None = [] if deltas else None
        # streamed responses: (time to the first chunk, the gaps between chunks), in ns
        self._streams: collections.deque[tuple[int, list[int]]] = collections.deque()
        self._first_chunk = Distribution(exact_limit=exact_limit)
        self._chunk_gap = Distribution(exact_limit=exact_limit)
        self._chunks = 0
        self._unsent_streams: list[tuple[int, list[int]]] | None = [] if deltas else None

    def record(self, trace: Trace) -> None:
        """Record a finished trace."""
        if trace.total_ns is None:
            raise ValueError("record() takes a finished trace: close it first")
        self._pending.append((trace.durations_ns, trace.total_ns, trace.error, trace.start_time))
        if len(self._pending) >= _FOLD_EVERY:
            self._fold()

    def record_ns(
        self, durations_ns: dict[str, int], total_ns: int, error: str | None = None, start_time: float | None = None
    ) -> None:
        """Record one request timed elsewhere in trusted integer nanoseconds (the hot path)."""
        self._pending.append((durations_ns, total_ns, error, start_time))
        if len(self._pending) >= _FOLD_EVERY:
            self._fold()

    def record_durations(
        self,
        durations_ms: Mapping[str, float],
        total_ms: float,
        *,
        error: str | None = None,
        start_time: float | None = None,
    ) -> None:
        """Record one request measured elsewhere (parsed Server-Timing, a load generator)."""
        # validate everything before touching any distribution, so a bad value loses nothing
        for name, ms in (("total", total_ms), *durations_ms.items()):
            if not isinstance(ms, (int, float)) or not (0 <= ms < math.inf):
                raise RecordError(f"{name}: durations must be finite and >= 0 ms, got {ms!r}; nothing was recorded")
        durations_ns = {k: round(v * 1e6) for k, v in durations_ms.items()}
        self._pending.append((durations_ns, round(total_ms * 1e6), error, start_time))
        if len(self._pending) >= _FOLD_EVERY:
            self._fold()

    def record_stream(self, first_chunk_ns: int, gaps_ns: list[int]) -> None:
        """One streamed response besides its ``record_ns``: the time from its arrival to its
        first chunk, and the gaps between its chunks (ns). The report's ``streaming`` section."""
        self._streams.append((first_chunk_ns, gaps_ns))

    def _fold_streams(self) -> None:
        streams = self._streams
        rows = [streams.popleft() for _ in range(len(streams))]
        if not rows:
            return
        if self._unsent_streams is not None:
            self._unsent_streams.extend(rows)
        self._first_chunk.extend(np.array([first for first, _ in rows], dtype=float) / 1e6)
        gaps = [g for _, gs in rows for g in gs]
        if gaps:
            self._chunk_gap.extend(np.array(gaps, dtype=float) / 1e6)
        self._chunks += len(rows) + len(gaps)

    def _fold(self) -> None:
        with self._lock:
            self._fold_streams()
            pending = self._pending
            rows = [pending.popleft() for _ in range(len(pending))]
            if not rows:
                return
            if self._unsent is not None:
                self._unsent.extend(rows)
            if self.first_ms is None:
                self.first_ms = rows[0][1] / 1e6
            room = self.keep_samples - len(self._sample_rows)
            if room > 0:  # raw rows: made into dicts only when a report asks
                self._sample_rows.extend(rows[:room])
            # rows of one endpoint share a few stage sets: per set, one array, one column per stage
            totals, groups, failed = _columns(rows)
            for total, error in failed:
                kind = error.split(":", 1)[0]
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self._error_latency.add(total / 1e6)
            self._latency.extend(totals)
            for keys, columns in groups:
                more = None
                for j, name in enumerate(keys):
                    dist = self._stages.get(name)
                    if dist is None:
                        if not self._names.admit(name):  # one MORE_STAGES sample per request
                            more = columns[:, j] if more is None else more + columns[:, j]
                            continue
                        dist = self._stages[name] = Distribution(exact_limit=self.exact_limit)
                    dist.extend(columns[:, j])
                if more is not None:
                    dist = self._stages.get(MORE_STAGES)
                    if dist is None:
                        dist = self._stages[MORE_STAGES] = Distribution(exact_limit=self.exact_limit)
                    dist.extend(more)

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The first ``keep_samples`` requests, one row each (start time, total, stages, error)."""
        self._fold()
        with self._lock:
            return self._samples_locked()

    def _samples_locked(self) -> list[dict[str, Any]]:
        out = []
        for durations, total, error, start in self._sample_rows:
            row: dict[str, Any] = {"t": start, "total_ms": total / 1e6, "stages": {k: v / 1e6 for k, v in durations.items()}}
            if error is not None:
                row["error"] = error
            out.append(row)
        return out

    def report(self, **meta: Any) -> Report:
        """A ``Report`` of everything recorded so far; keyword arguments go to ``meta``."""
        self._fold()
        with self._lock:
            return Report.from_distributions(
                self._latency,
                dict(self._stages),
                first_ms=self.first_ms,
                errors=dict(self.errors),
                error_latency=self._error_latency if len(self._error_latency) else None,
                samples=self._samples_locked(),
                meta=meta,
                extra=self._extra(),
                streaming=Streaming.from_distributions(self._first_chunk, self._chunk_gap, chunks=self._chunks)
                if len(self._first_chunk)
                else None,
            )

    def _extra(self) -> dict[str, Any]:
        folded = self._names.summary()
        return {} if folded is None else {"folded_stage_names": folded}

    def take_delta(self, **meta: Any) -> Report | None:
        """What was recorded since the previous call, as a Report with its distributions (None
        when nothing was): a running server ships these to be merged elsewhere, so the merged
        figures stay exact however long it runs. Needs ``Recorder(deltas=True)``."""
        if self._unsent is None:
            raise RecordError("take_delta() needs a Recorder(deltas=True)")
        self._fold()
        with self._lock:
            rows, self._unsent = self._unsent, []
            streams, self._unsent_streams = self._unsent_streams, []
        if not rows and not streams:
            return None
        part = Recorder(exact_limit=self.exact_limit, keep_samples=0, max_stage_names=self._names.limit)
        part._streams.extend(streams or ())
        part._names.kept = set(self._names.kept)  # the same names apart, the same folded
        part._names.folded = list(self._names.folded)
        part._pending.extend(rows)
        return part.report(**meta)

    @property
    def latency(self) -> Distribution:
        """End-to-end latency of successful requests (ms)."""
        self._fold()
        return self._latency

    def stream_distributions(self) -> dict[str, Distribution]:
        """``first_chunk`` and ``chunk_gap`` of the streamed responses (ms), {} when none was."""
        self._fold()
        return {"first_chunk": self._first_chunk, "chunk_gap": self._chunk_gap} if len(self._first_chunk) else {}

    @property
    def stages(self) -> dict[str, Distribution]:
        """Stage name -> its distribution over successful requests (ms)."""
        self._fold()
        return self._stages

    def __len__(self) -> int:
        """Requests recorded, failed ones included."""
        self._fold()
        return len(self._latency) + len(self._error_latency)

    def __repr__(self) -> str:
        self._fold()
        return f"<Recorder requests={len(self._latency)} errors={sum(self.errors.values())}>"
