"""Where finished traces go besides the recorder: Prometheus, OpenTelemetry, JSON lines.

Each exporter has ``export(trace, info)``, called once per finished request by the
middleware (or by you). Each imports its library only when constructed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Any, Sequence

import orjson

from .exceptions import ConfigError, require
from .recorder import MORE_STAGES, StageNames
from .timing import Trace

__all__ = [
    "JsonLinesExporter", "OpenTelemetryExporter", "PrometheusExporter", "RecorderCollector", "RecorderMetrics", "STAGE_BUCKETS",
]  # fmt: skip

#: Seconds. Prometheus's default buckets start at 5 ms and would put every fast stage in one
#: bucket; these resolve 50 us stages as well as 30 s requests.
STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class PrometheusExporter:
    """Histograms per stage and per request, and requests counted by status.

        exporter = PrometheusExporter()
        app.add_middleware(ServescopeMiddleware, exporters=[exporter])   # serves /metrics

    Metrics: ``{prefix}_stage_seconds{stage}``, ``{prefix}_request_seconds``,
    ``{prefix}_requests_total{status}``. Under gunicorn or several uvicorn workers, set
    ``PROMETHEUS_MULTIPROC_DIR`` before start-up: the client's multiprocess mode then writes
    each worker's samples there and ``/metrics`` merges all workers.
    """

    def __init__(
        self,
        *,
        registry: Any = None,
        prefix: str = "servescope",
        buckets: Sequence[float] = STAGE_BUCKETS,
        max_stage_names: int = 256,
    ) -> None:
        prom = require("prometheus_client", "prometheus", "PrometheusExporter needs it.")
        self._names = StageNames(max_stage_names, "PrometheusExporter")  # bounded label values
        if list(buckets) != sorted(buckets) or not buckets:
            raise ConfigError(f"buckets must be a non-empty increasing sequence of seconds, got {buckets!r}")
        self._prom = prom
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.stage_seconds = prom.Histogram(
            f"{prefix}_stage_seconds", "Time per request spent in each stage", ["stage"],
            buckets=buckets, registry=self.registry,
        )  # fmt: skip
        self.request_seconds = prom.Histogram(
            f"{prefix}_request_seconds", "Server time per request", buckets=buckets, registry=self.registry
        )
        self.requests = prom.Counter(
            f"{prefix}_requests", "Requests by response status", ["status"], registry=self.registry
        )
        self._children: dict[str, Any] = {}  # .labels() costs a microsecond: once per stage

    def export(self, trace: Trace, info: Any = None) -> None:
        self.observe(trace.durations_ns, trace.total_ns, getattr(info, "status", None))

    def observe(self, durations_ns: dict[str, int], total_ns: int | None, status: int | None) -> None:
        """Record one request's stages (ns), total and response status."""
        children = self._children
        more = 0
        for name, ns in durations_ns.items():
            child = children.get(name)
            if child is None:
                if not self._names.admit(name):
                    more += ns
                    continue
                child = children[name] = self.stage_seconds.labels(name)
            child.observe(ns / 1e9)
        if more:
            self.stage_seconds.labels(MORE_STAGES).observe(more / 1e9)
        if total_ns is not None:
            self.request_seconds.observe(total_ns / 1e9)
        self.requests.labels(str(status) if status is not None else "error").inc()

    def exposition(self) -> tuple[bytes, str]:
        """The ``/metrics`` body and its content type (all workers' in multiprocess mode)."""
        prom = self._prom
        registry = self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST


#: The streaming figures' metric names (``{prefix}_{name}_seconds``).
STREAM_METRICS = {"first_chunk": "time_to_first_chunk", "chunk_gap": "chunk_gap"}


class _ReportFigures:
    """A Report's distributions in a Recorder's shape (stages, latency, errors)."""

    def __init__(self, report: Any) -> None:
        from .stats import Distribution

        self.stages = report.stage_distributions()
        self.latency = report.distributions.get("total") or Distribution()
        self.errors = report.errors
        streaming = report.streaming
        self._streams = {} if streaming is None else {n: streaming.distribution(n) for n in ("first_chunk", "chunk_gap")}

    def stream_distributions(self) -> dict[str, Any]:
        return self._streams


class RecorderCollector:
    """Prometheus metrics computed from a Recorder when scraped, not observed per request.

    The recorder already keeps every stage's distribution, so the request path pays nothing
    more for /metrics: ``{prefix}_stage_seconds{stage}``, ``{prefix}_request_seconds`` and
    ``{prefix}_requests_total{status}`` are built at scrape time (single process; under
    several workers use PrometheusExporter's multiprocess mode).

        registry.register(RecorderCollector(recorder))
    """

    def __init__(self, recorder: Any, *, prefix: str = "servescope", buckets: Sequence[float] = STAGE_BUCKETS) -> None:
        """``recorder``: a Recorder, or a callable returning a Report (read at each scrape: the
        merged figures of several workers or replicas)."""
        require("prometheus_client", "prometheus", "RecorderCollector needs it.")
        self.recorder = recorder
        self.prefix = prefix
        self.buckets = list(buckets)

    def _histogram(self, family: Any, labels: list[str], dist: Any) -> None:
        counts = dist.count_le([b * 1000 for b in self.buckets])
        pairs = [(repr(float(b)), float(c)) for b, c in zip(self.buckets, counts)]
        pairs.append(("+Inf", float(len(dist))))
        family.add_metric(labels, pairs, dist.total() / 1000)

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        rec = self.recorder
        if callable(rec):
            rec = _ReportFigures(rec())
        stages = HistogramMetricFamily(f"{self.prefix}_stage_seconds", "Time per request spent in each stage", labels=["stage"])
        for name, dist in rec.stages.items():
            self._histogram(stages, [name], dist)
        yield stages
        request = HistogramMetricFamily(f"{self.prefix}_request_seconds", "Server time per successful request")
        self._histogram(request, [], rec.latency)
        yield request
        for name, help_ in (
            ("first_chunk", "Streamed responses: from the request's arrival to its first chunk"),
            ("chunk_gap", "Streamed responses: between consecutive chunks"),
        ):
            dist = rec.stream_distributions().get(name)
            if dist is not None:
                family = HistogramMetricFamily(f"{self.prefix}_{STREAM_METRICS[name]}_seconds", help_)
                self._histogram(family, [], dist)
                yield family
        counter = CounterMetricFamily(f"{self.prefix}_requests", "Requests by response status", labels=["status"])
        if len(rec.latency):
            counter.add_metric(["200"], float(len(rec.latency)))
        for kind, n in rec.errors.items():
            status = kind[5:] if kind.startswith("HTTP ") else "error"
            counter.add_metric([status], float(n))
        yield counter


class RecorderMetrics:
    """A ``/metrics`` body computed from a Recorder when scraped: what the one-line middleware
    serves when no ``PrometheusExporter`` is given (nothing is added to the request path).

        body, content_type = RecorderMetrics(recorder).exposition()

    Single process, and what the recorder saw (the sampled requests); under several workers
    give the middleware a ``PrometheusExporter`` in multiprocess mode instead.
    """

    def __init__(self, recorder: Any, *, prefix: str = "servescope", buckets: Sequence[float] = STAGE_BUCKETS) -> None:
        prom = require("prometheus_client", "prometheus", "/metrics needs it.")
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        self.registry.register(RecorderCollector(recorder, prefix=prefix, buckets=buckets))

    def exposition(self) -> tuple[bytes, str]:
        """The ``/metrics`` body and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST


class OpenTelemetryExporter:
    """A span per request with a child span per stage, timed from the trace's own timestamps
    (nothing is measured twice).

        from opentelemetry.sdk.trace import TracerProvider
        exporter = OpenTelemetryExporter(tracer_provider=TracerProvider())
    """

    def __init__(self, *, tracer_provider: Any = None, name: str = "servescope") -> None:
        otel = require("opentelemetry.trace", "otel", "OpenTelemetryExporter needs opentelemetry-sdk.")
        self._otel = otel
        self.tracer = (tracer_provider or otel.get_tracer_provider()).get_tracer(name)

    def export(self, trace: Trace, info: Any = None) -> None:
        otel = self._otel
        if trace.total_ns is None:
            return
        start = round(trace.start_time * 1e9)
        method = getattr(info, "method", None)
        path = getattr(info, "path", None)
        name = f"{method} {path}" if method else "request"
        root = self.tracer.start_span(name, start_time=start, kind=otel.SpanKind.SERVER)
        if method:
            root.set_attribute("http.request.method", method)
            root.set_attribute("url.path", path)
        status = getattr(info, "status", None)
        if status is not None:
            root.set_attribute("http.response.status_code", status)
        if trace.error:
            root.set_status(otel.Status(otel.StatusCode.ERROR, trace.error))
        parents = [root]
        for stage_name, start_ms, end_ms, depth in trace.spans():
            del parents[depth + 1 :]
            ctx = otel.set_span_in_context(parents[depth])
            span = self.tracer.start_span(stage_name, context=ctx, start_time=start + round(start_ms * 1e6))
            span.set_attribute("servescope.stage", stage_name)
            span.end(end_time=start + round(end_ms * 1e6))
            parents.append(span)
        root.end(end_time=start + trace.total_ns)


class JsonLinesExporter:
    """One JSON object per request: ``t``, ``method``, ``path``, ``status``, ``total_ms``,
    ``stages`` (ms) and ``error`` when it failed. Give a path or an open binary file."""

    def __init__(self, target: str | Path | IO[bytes], *, flush: bool = True) -> None:
        if isinstance(target, (str, Path)):
            self._file: IO[bytes] = open(target, "ab")  # noqa: SIM115 - closed by close()
            self._owned = True
        elif hasattr(target, "write"):
            self._file = target
            self._owned = False
        else:
            raise ConfigError(f"JsonLinesExporter takes a path or a binary file, got {target!r}")
        self._flush = flush
        self._lock = threading.Lock()

    def export(self, trace: Trace, info: Any = None) -> None:
        row: dict[str, Any] = {
            "t": round(trace.start_time, 6),
            "method": getattr(info, "method", None),
            "path": getattr(info, "path", None),
            "status": getattr(info, "status", None),
            "total_ms": trace.total_ms,
            "stages": trace.durations_ms,
        }
        if trace.error:
            row["error"] = trace.error
        line = orjson.dumps(row) + b"\n"
        with self._lock:
            self._file.write(line)
            if self._flush:
                self._file.flush()

    def close(self) -> None:
        if self._owned:
            self._file.close()
