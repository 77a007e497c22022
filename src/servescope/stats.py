"""Latency distributions: exact while small, a mergeable sketch when long.

A ``Distribution`` keeps every sample (milliseconds) up to ``exact_limit`` and reports exact
percentiles (linear interpolation between order statistics, as ``numpy.percentile``). Past
that limit it folds everything into a logarithmic sketch (DDSketch, Masson et al., VLDB 2019)
with relative accuracy ``ALPHA``: every reported quantile is within 0.5% of the true sample
value of that rank, memory is bounded (a few thousand counters cover 1 ns to 3 hours), and two
sketches merge exactly by adding counters. Percentiles are never averaged: reports combine by
merging distributions.

Samples are appended to a Python list (tens of nanoseconds) and folded into the sketch in
vectorised batches, so recording stays cheap on a server's hot path.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any, Iterable

import numpy as np

from .exceptions import RecordError, ReportError

__all__ = ["ALPHA", "Distribution", "PERCENTILES", "summarize"]

#: Relative accuracy of the sketch.
ALPHA = 0.005
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(_GAMMA)
#: Smallest and largest values the sketch resolves (ms). Smaller ones count as MIN_MS,
#: larger ones in the top bucket; the exact min and max are always kept beside it.
MIN_MS = 1e-6
MAX_MS = 1e7
_OFFSET = math.ceil(math.log(MIN_MS) / _LOG_GAMMA)
_NBUCKETS = math.ceil(math.log(MAX_MS) / _LOG_GAMMA) - _OFFSET + 1
_FOLD_EVERY = 4096

PERCENTILES = (50, 90, 95, 99)


def _check(values: np.ndarray, where: str) -> None:
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        raise RecordError(
            f"{where}: durations must be finite and >= 0 ms, got {values[bad][0]!r}; nothing was recorded"
        )


class Distribution:
    """Samples of one quantity in milliseconds: exact up to ``exact_limit``, then a sketch.

        d = Distribution()
        d.add(1.5); d.extend([2.0, 3.5])
        d.percentile(50)   # 2.0
    """

    def __init__(self, *, exact_limit: int = 100_000) -> None:
        if not isinstance(exact_limit, int) or exact_limit < 0:
            raise RecordError(f"exact_limit must be an int >= 0, got {exact_limit!r}")
        self.exact_limit = exact_limit
        self._pending: collections.deque[float] = collections.deque()  # atomic appends, drained by count
        self._parts: list[np.ndarray] = []  # the exact samples, in chunks joined on reading
        self._n_exact = 0
        self._counts: np.ndarray | None = None  # the sketch, once exact_limit is passed
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._lock = threading.RLock()

    @property
    def _exact(self) -> np.ndarray:
        """The exact samples as one array (joined once here, not at every fold: appending a
        chunk stays O(chunk) however many samples are kept)."""
        with self._lock:
            parts = self._parts
            if len(parts) == 1:
                return parts[0]
            joined = np.concatenate(parts) if parts else np.empty(0)
            self._parts = [joined] if joined.size else []
            return joined

    @_exact.setter
    def _exact(self, arr: np.ndarray) -> None:
        self._parts = [arr] if arr.size else []
        self._n_exact = int(arr.size)

    # -- recording ---------------------------------------------------------------------------
    def add(self, value_ms: float) -> None:
        """Record one value; raises ``RecordError`` (recording nothing) if it is invalid."""
        if not (value_ms >= 0 and value_ms != math.inf):  # also rejects NaN
            raise RecordError(f"durations must be finite and >= 0 ms, got {value_ms!r}; nothing was recorded")
        self._pending.append(value_ms)
        if len(self._pending) >= _FOLD_EVERY:
            self._flush()

    def extend(self, values_ms: Iterable[float]) -> None:
        arr = values_ms if isinstance(values_ms, np.ndarray) else np.asarray(list(values_ms), dtype=float)
        arr = arr.astype(float, copy=False)
        _check(arr, "extend")
        with self._lock:
            self._absorb(arr)

    def _flush(self) -> None:
        with self._lock:
            queued = self._pending
            pending = [queued.popleft() for _ in range(len(queued))]
            if pending:
                self._absorb(np.asarray(pending, dtype=float))

    def _absorb(self, arr: np.ndarray) -> None:
        if arr.size == 0:
            return
        self._count += arr.size
        self._sum += float(arr.sum())
        self._min = min(self._min, float(arr.min()))
        self._max = max(self._max, float(arr.max()))
        if self._counts is None:
            self._parts.append(arr)
            self._n_exact += arr.size
            if self._n_exact > self.exact_limit:
                self._counts = np.zeros(_NBUCKETS, dtype=np.int64)
                self._bucket(self._exact)
                self._exact = np.empty(0)
        else:
            self._bucket(arr)

    def _bucket(self, arr: np.ndarray) -> None:
        assert self._counts is not None
        idx = np.ceil(np.log(np.clip(arr, MIN_MS, MAX_MS)) / _LOG_GAMMA).astype(np.int64) - _OFFSET
        self._counts += np.bincount(np.clip(idx, 0, _NBUCKETS - 1), minlength=_NBUCKETS)

    # -- reading -----------------------------------------------------------------------------
    @property
    def exact(self) -> bool:
        """True while every sample is kept (percentiles are exact)."""
        self._flush()
        return self._counts is None

    def __len__(self) -> int:
        self._flush()
        return self._count

    def values(self) -> np.ndarray:
        """The samples, when kept (``exact``); raises otherwise."""
        self._flush()
        if self._counts is not None:
            raise ReportError("this distribution was folded into a sketch: its samples are gone")
        return self._exact.copy()

    def mean(self) -> float:
        n = len(self)
        return self._sum / n if n else math.nan

    def max(self) -> float:
        return self._max if len(self) else math.nan

    def min(self) -> float:
        return self._min if len(self) else math.nan

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100); NaN when empty."""
        return self.percentiles([q])[0]

    def percentiles(self, qs: Iterable[float]) -> list[float]:
        qs = list(qs)
        if len(self) == 0:
            return [math.nan] * len(qs)
        if self._counts is None:
            return [float(v) for v in np.percentile(self._exact, qs)]
        cum = np.cumsum(self._counts)
        out = []
        for q in qs:
            rank = q / 100 * (self._count - 1)
            i = int(np.searchsorted(cum, rank, side="right"))
            value = 2 * _GAMMA ** (i + _OFFSET) / (_GAMMA + 1)
            out.append(min(max(value, self._min), self._max))
        return out

    def count_le(self, bounds: Iterable[float]) -> list[int]:
        """How many samples are <= each bound (ms): a histogram's cumulative buckets."""
        bounds = list(bounds)
        if len(self) == 0:
            return [0] * len(bounds)
        if self._counts is None:
            values = np.sort(self._exact)
            return [int(n) for n in np.searchsorted(values, bounds, side="right")]
        cum = np.cumsum(self._counts)
        idx = np.ceil(np.log(np.clip(bounds, MIN_MS, MAX_MS)) / _LOG_GAMMA).astype(np.int64) - _OFFSET
        return [int(cum[min(max(i, 0), _NBUCKETS - 1)]) for i in idx]

    def total(self) -> float:
        """The sum of all samples (ms)."""
        len(self)
        return self._sum

    # -- merging and serialization -----------------------------------------------------------
    def merge(self, other: Distribution) -> Distribution:
        """A new distribution holding both sets of samples (exact if both are, and small)."""
        out = Distribution(exact_limit=max(self.exact_limit, other.exact_limit))
        for d in (self, other):
            d._flush()
            if d._counts is None:
                out._absorb(d._exact)
        sketches = [d for d in (self, other) if d._counts is not None]
        if sketches:
            if out._counts is None:
                out._counts = np.zeros(_NBUCKETS, dtype=np.int64)
                if out._exact.size:
                    out._bucket(out._exact)
                out._exact = np.empty(0)
            for d in sketches:
                out._counts += d._counts
                out._count += d._count
                out._sum += d._sum
                out._min = min(out._min, d._min)
                out._max = max(out._max, d._max)
        return out

    def to_dict(self) -> dict[str, Any]:
        self._flush()
        if self._counts is None:
            return {"kind": "exact", "values_ms": [round(v, 6) for v in self._exact.tolist()]}
        nz = np.nonzero(self._counts)[0]
        return {
            "kind": "sketch",
            "alpha": ALPHA,
            "offset": _OFFSET,
            "count": self._count,
            "sum_ms": self._sum,
            "min_ms": self._min,
            "max_ms": self._max,
            "buckets": nz.tolist(),
            "counts": self._counts[nz].tolist(),
        }

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "distribution") -> Distribution:
        if not isinstance(data, dict) or data.get("kind") not in ("exact", "sketch"):
            raise ReportError(f"{where}: expected an object with kind 'exact' or 'sketch'")
        out = cls()
        try:
            if data["kind"] == "exact":
                arr = np.asarray(data["values_ms"], dtype=float)
                _check(arr, where)
                out.exact_limit = max(out.exact_limit, arr.size)
                out._absorb(arr)
                return out
            if data["alpha"] != ALPHA or data["offset"] != _OFFSET:
                raise ReportError(f"{where}: sketch made with alpha={data['alpha']}, this version uses {ALPHA}")
            counts = np.zeros(_NBUCKETS, dtype=np.int64)
            counts[np.asarray(data["buckets"], dtype=np.int64)] = np.asarray(data["counts"], dtype=np.int64)
            out._counts = counts
            out._count = int(data["count"])
            out._sum = float(data["sum_ms"])
            out._min = float(data["min_ms"])
            out._max = float(data["max_ms"])
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            if isinstance(exc, ReportError):
                raise
            raise ReportError(f"{where}: malformed distribution ({type(exc).__name__}: {exc})") from None
        return out

    def __repr__(self) -> str:
        mode = "exact" if self.exact else f"sketch alpha={ALPHA}"
        return f"<Distribution n={len(self)} {mode}>"


def summarize(d: Distribution) -> dict[str, Any]:
    """The statistics every report prints: count, mean, p50, p90, p95, p99, max (ms)."""
    p50, p90, p95, p99 = d.percentiles(PERCENTILES)
    return {
        "count": len(d),
        "mean_ms": _r(d.mean()),
        "p50_ms": _r(p50),
        "p90_ms": _r(p90),
        "p95_ms": _r(p95),
        "p99_ms": _r(p99),
        "max_ms": _r(d.max()),
    }


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)
