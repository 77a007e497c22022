"""The server's own metrics over a load level's measured window (``bench --scrape``), and the
GPUs' (``load.server_metrics``, ``load.gpu``).

    window = MetricsWindow()
    window.add(t_ns, text)            # each scrape's Prometheus text, in order
    section = window.summary(url="http://127.0.0.1:8000/metrics", interval_s=1.0)

Gauges are summarised over the scrapes (min, mean, max); counters by their increase over the
window (a reset counted from zero, as Prometheus's ``increase`` does) and its rate; histograms
by the window's bucket increments: the count, the exact mean (``_sum`` / ``_count``) and
p50/p90/p99 *estimated from the buckets* by linear interpolation within the bucket, as
Prometheus's ``histogram_quantile`` does. ``KNOWN`` names what vLLM, TGI, Triton and
servescope expose, so the report can say what each figure is; other series are kept, bounded.
The sampling itself (a thread, an HTTP GET, NVML) is ``load/sampler.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..exceptions import require
from ..sections import Section
from .known_metrics import KNOWN, Known, known, rank

__all__ = [
    "KNOWN", "MAX_SERIES", "Gpu", "GpuDevice", "Known", "MetricSeries", "MetricsWindow", "Range", "ServerMetrics",
    "bucket_quantile", "parse_metrics",
]  # fmt: skip

#: Series kept in the report, the known ones first; those past it are counted in ``left_out``.
MAX_SERIES = 200
#: Series followed during a window (a server exposing more is cut here, the known ones kept).
MAX_TRACKED = 2000


# -- the report's sections --------------------------------------------------------------------
@dataclass(kw_only=True)
class Range(Section):
    """A figure sampled during the window: its smallest, mean and largest value."""

    min: float | None = None
    mean: float | None = None
    max: float | None = None


@dataclass(kw_only=True)
class MetricSeries(Section):
    """One series of the server's metrics over the measured window, in the metric's own unit."""

    #: as the server writes it (a counter with its ``_total`` when it has one)
    name: str
    #: gauge, counter, histogram or summary
    type: str = "gauge"
    labels: dict[str, str] = field(default_factory=dict)
    #: the server whose name it is (vllm, tgi, triton, servescope, process), its description
    #: and unit (``KNOWN``); null for a metric servescope does not know
    server: str | None = None
    label: str | None = None
    unit: str | None = None
    #: the window's scrapes that had it
    scrapes: int = 0
    #: gauges: over the scrapes
    value: Range | None = None
    #: counters: the increase over the window, per second of it, and per request of ``per``
    increase: float | None = None
    per_s: float | None = None
    per_request: float | None = None
    #: histograms and summaries: observations in the window and their mean (exact)
    count: float | None = None
    mean: float | None = None
    #: histograms: estimated from the window's bucket increments (linear within a bucket)
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    #: observations above the highest finite bucket (a quantile there is that bucket's bound)
    over_top: float | None = None
    #: the window's cumulative count per bucket (``le`` as written -> count)
    buckets: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class ServerMetrics(Section):
    """``bench --scrape``: the server's own metrics over the level's measured window."""

    url: str = ""
    interval_s: float = 1.0
    #: the servers whose metric names were seen (vllm, tgi, triton, servescope)
    servers: list[str] = field(default_factory=list)
    #: successful scrapes in the window (one at its start, one at its end, every interval
    #: between), and those that failed, with the first failure's reason
    scrapes: int = 0
    failed: int = 0
    first_error: str | None = None
    #: from the first successful scrape to the last: counters' rates are over it
    window_s: float | None = None
    series: list[MetricSeries] = field(default_factory=list)
    #: series past ``MAX_SERIES`` (or never followed, past ``MAX_TRACKED``), not kept
    left_out: int = 0


@dataclass(kw_only=True)
class GpuDevice(Section):
    """One GPU of this machine over the window (NVML)."""

    index: int = 0
    name: str = ""
    uuid: str | None = None
    samples: int = 0
    #: NVML's utilization: the share of the last sample period (1/6 s to 1 s) in which a
    #: kernel ran, and in which memory was read or written
    utilization_pct: Range | None = None
    memory_utilization_pct: Range | None = None
    memory_used_bytes: Range | None = None
    memory_total_bytes: float | None = None


@dataclass(kw_only=True)
class Gpu(Section):
    """This machine's GPUs over the measured window (nvidia-ml-py), when it has any."""

    #: the machine they are on (the endpoint's only when it runs there)
    host: str = ""
    interval_s: float = 1.0
    driver: str | None = None
    samples: int = 0
    failed: int = 0
    first_error: str | None = None
    devices: list[GpuDevice] = field(default_factory=list)


# -- reading one scrape -----------------------------------------------------------------------
Labels = tuple[tuple[str, str], ...]


class Hist(NamedTuple):
    """A histogram's (or summary's) state at one scrape: cumulative count per bucket, count, sum."""

    buckets: dict[str, float]
    count: float
    sum: float


def parse_metrics(text: str) -> dict[tuple[str, Labels], tuple[str, Any]]:
    """One scrape's series: (name, labels) -> (type, value: a float, or a ``Hist``).

    Raises ValueError when the text is not Prometheus's text format. Counters keep the name
    the server wrote (``vllm:prompt_tokens_total``, Triton's ``nv_inference_request_success``);
    the client library's ``*_created`` timestamps are left out; a summary's quantiles are gauges.
    """
    parser = require("prometheus_client.parser", "prometheus", "bench --scrape reads the server's metrics with it.")
    families = list(parser.text_string_to_metric_families(text))  # type: ignore[attr-defined]
    bases = {f.name for f in families if f.type in ("counter", "histogram", "summary")}
    out: dict[tuple[str, Labels], tuple[str, Any]] = {}
    written: set[str] | None = None  # the sample names as the text has them (the parser adds _total)
    for fam in families:
        kind = fam.type
        if kind in ("gauge", "unknown", "untyped"):
            if fam.name.endswith("_created") and fam.name[: -len("_created")] in bases:
                continue
            for s in fam.samples:
                out[(s.name, _labels(s.labels))] = ("gauge", float(s.value))
        elif kind == "counter":
            if written is None:
                written = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line[:1] not in ("#", "")}
            name = fam.name + "_total" if fam.name + "_total" in written else fam.name
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    out[(name, _labels(s.labels))] = ("counter", float(s.value))
        elif kind in ("histogram", "summary"):
            parts: dict[Labels, dict[str, Any]] = {}
            for s in fam.samples:
                labels = dict(s.labels)
                le, quantile = labels.pop("le", None), labels.pop("quantile", None)
                part = parts.setdefault(_labels(labels), {"buckets": {}, "count": 0.0, "sum": 0.0})
                if s.name.endswith("_bucket") and le is not None:
                    part["buckets"][le] = float(s.value)
                elif s.name.endswith("_count"):
                    part["count"] = float(s.value)
                elif s.name.endswith("_sum"):
                    part["sum"] = float(s.value)
                elif quantile is not None:
                    out[(fam.name, _labels({**labels, "quantile": quantile}))] = ("gauge", float(s.value))
            for labels_key, part in parts.items():
                out[(fam.name, labels_key)] = (kind, Hist(part["buckets"], part["count"], part["sum"]))
    return out


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _le(bound: str) -> float:
    return math.inf if bound in ("+Inf", "Inf", "inf") else float(bound)


def bucket_quantile(q: float, buckets: dict[str, float]) -> float | None:
    """The ``q`` quantile (0 to 1) estimated from cumulative bucket counts (``le`` -> count), as
    Prometheus's ``histogram_quantile``: linear within the bucket it falls in (from 0 for the
    first bucket), the highest finite bound when it falls above it. None without observations
    or without the ``+Inf`` bucket."""
    pairs = sorted((_le(k), v) for k, v in buckets.items())
    if not pairs or pairs[-1][0] != math.inf or pairs[-1][1] <= 0:
        return None
    total = pairs[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for i, (upper, count) in enumerate(pairs):
        count = max(count, below)  # counts taken while requests finish can be a hair out of order
        if count >= rank:
            if upper == math.inf:
                return pairs[i - 1][0] if i else None
            if i == 0 and upper <= 0:
                return upper
            inside = count - below
            return upper if inside <= 0 else lower + (upper - lower) * (rank - below) / inside
        lower, below = upper, count
    return None  # pragma: no cover - the +Inf bucket holds every observation


# -- a window of scrapes ----------------------------------------------------------------------
class _Track:
    """One series followed over the window's scrapes."""

    def __init__(self, kind: str, at_start: bool) -> None:
        self.kind, self.at_start, self.scrapes = kind, at_start, 0
        self.lo, self.hi, self.total, self.finite = math.inf, -math.inf, 0.0, 0
        self.prev: Any = None
        self.increase = 0.0
        self.inc_buckets: dict[str, float] = {}
        self.inc_count = self.inc_sum = 0.0

    def add(self, value: Any) -> None:
        self.scrapes += 1
        if self.kind == "gauge":
            if math.isfinite(value):
                self.lo, self.hi, self.total, self.finite = min(self.lo, value), max(self.hi, value), self.total + value, self.finite + 1
        elif self.kind == "counter":
            if not math.isfinite(value):
                return
            # a series first seen after the window's first scrape was created in it, from zero
            prev = self.prev if self.prev is not None else (value if self.at_start else 0.0)
            self.increase += value - prev if value >= prev else value  # lower: the counter was reset
            self.prev = value
        else:
            prev = self.prev if self.prev is not None else (value if self.at_start else Hist({}, 0.0, 0.0))
            if value.count < prev.count:  # reset: this scrape's counts are all new
                prev = Hist({}, 0.0, 0.0)
            for le, n in value.buckets.items():
                self.inc_buckets[le] = self.inc_buckets.get(le, 0.0) + n - prev.buckets.get(le, 0.0)
            self.inc_count += value.count - prev.count
            self.inc_sum += value.sum - prev.sum
            self.prev = value


class MetricsWindow:
    """The scrapes of one measured window, reduced as they come (memory per series, not per
    scrape); ``summary`` gives the report's section."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, Labels], _Track] = {}
        self.times_ns: list[int] = []
        self.failed = 0
        self.first_error: str | None = None
        self._first_error_ns = 0
        self.untracked = 0

    def add(self, t_ns: int, text: str) -> None:
        """One successful scrape taken at ``t_ns``; ValueError (nothing added) when unparsable."""
        readings = parse_metrics(text)
        at_start = not self.times_ns
        self.times_ns.append(t_ns)
        for key, (kind, value) in readings.items():
            track = self.tracks.get(key)
            if track is None:
                if len(self.tracks) >= MAX_TRACKED and known(key[0]) is None:
                    self.untracked += 1
                    continue
                track = self.tracks[key] = _Track(kind, at_start)
            if track.kind == kind:
                track.add(value)

    def fail(self, why: str, t_ns: int = 0) -> None:
        """A scrape taken at ``t_ns`` that failed (refused, timed out, not 200, unparsable): the
        earliest one's reason is kept."""
        self.failed += 1
        if self.first_error is None or t_ns < self._first_error_ns:
            self.first_error, self._first_error_ns = why, t_ns

    def summary(self, *, url: str, interval_s: float) -> ServerMetrics:
        times = self.times_ns
        window_s = (times[-1] - times[0]) / 1e9 if len(times) > 1 else None
        rows = [self._series(name, dict(labels), track, window_s) for (name, labels), track in self.tracks.items()]
        for row in rows:
            k = known(row.name)
            per = k[1].per if k is not None else None
            track = self.tracks.get((per, _labels(row.labels))) if per else None
            if track is not None and track.increase > 0 and row.increase is not None:
                row.per_request = _round(row.increase / track.increase)
        rows.sort(key=lambda r: (0, rank(r.name), sorted(r.labels.items())) if rank(r.name) is not None else (1, 0, []))  # known first
        servers = sorted({r.server for r in rows if r.server not in (None, "process")}, key=list(KNOWN).index)  # type: ignore[arg-type]
        return ServerMetrics(
            url=url, interval_s=interval_s, servers=servers, scrapes=len(times), failed=self.failed,
            first_error=self.first_error, window_s=None if window_s is None else round(window_s, 3),
            series=rows[:MAX_SERIES], left_out=max(len(rows) - MAX_SERIES, 0) + self.untracked,
        )  # fmt: skip

    @staticmethod
    def _series(name: str, labels: dict[str, str], t: _Track, window_s: float | None) -> MetricSeries:
        k = known(name)
        row = MetricSeries(
            name=name, type=t.kind, labels=labels, scrapes=t.scrapes,
            server=k[0] if k else None, label=k[1].label if k else None, unit=k[1].unit if k else None,
        )  # fmt: skip
        if t.kind == "gauge":
            if t.finite:
                row.value = Range(min=_round(t.lo), mean=_round(t.total / t.finite), max=_round(t.hi))
        elif t.kind == "counter":
            row.increase = _round(t.increase)
            row.per_s = _round(t.increase / window_s) if window_s else None
        else:
            row.count = _round(t.inc_count)
            row.mean = _round(t.inc_sum / t.inc_count) if t.inc_count > 0 else None
            if t.inc_buckets:
                row.buckets = {le: _round(n) or 0.0 for le, n in sorted(t.inc_buckets.items(), key=lambda kv: _le(kv[0]))}
                for q in (50, 90, 99):
                    setattr(row, f"p{q}", _round(bucket_quantile(q / 100, t.inc_buckets)))
                finite = [n for le, n in t.inc_buckets.items() if _le(le) != math.inf]
                top = t.inc_buckets.get("+Inf")
                row.over_top = _round(top - max(finite, default=0.0)) if top is not None else None
        return row


def _round(x: float | None) -> float | None:
    """Nine significant digits: a counter stays whole to a billion, float noise goes."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.9g}") if x else 0.0
