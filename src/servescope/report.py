"""The Report: one plain, serializable record of a run, between every part of servescope.

The load generator and the doctor produce it, the rules read it, the renderers format it, and
``servescope report FILE`` re-renders a saved one offline. Its JSON form is a contract
(docs/report-schema.md); the top level is:

    schema        "servescope.report/2" (version 1 files load too)
    created       ISO-8601 time the report was made
    environment   Python, CPUs, torch and device (see environment.py)
    latency       end-to-end statistics of successful requests: count, mean_ms, p50_ms, p90_ms,
                  p95_ms, p99_ms, max_ms, and first_ms when a first request was seen
    stages        stage name -> the same statistics plus share (of the mean total)
    findings      [{id, severity, title, evidence, fix, saving_ms, ...}]
    errors        failed requests by kind -> count
    distributions "total" and each stage -> the samples or a sketch (how reports combine)
    samples       per-request rows, when kept
    meta          what was run: tool, target, options
    load, sweep, diagnosis, folded_stage_names, streaming
                  the typed sections a tool adds (sections/), as ``report.load`` ...
    ...           any other key is kept as is (``report.unknown``)
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import orjson

from .environment import capture_environment
from .exceptions import ReportError, SchemaError
from .schema import check_types, check_v1_fields
from .sections import SECTIONS, V1_FIELDS, Diagnosis, ExtraView, FoldedStages, Load, Streaming, Sweep
from .stats import Distribution, summarize
from .timing import order_stages

__all__ = ["Finding", "Report", "SCHEMA", "SEVERITIES"]

SCHEMA_NAME = "servescope.report"
SCHEMA_VERSION = 2
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"
#: Worst first.
SEVERITIES = ("critical", "high", "medium", "low", "info")
#: ``Report.fetch``: the largest answer read (a server's /report with 100,000 samples in each of
#: a dozen distributions is ~15 MB), and the time the whole fetch may take.
MAX_FETCH_BYTES = 64 * 1024 * 1024
FETCH_TIMEOUT_S = 30.0
_KNOWN = {
    "schema",
    "created",
    "environment",
    "latency",
    "stages",
    "findings",
    "errors",
    "distributions",
    "samples",
    "meta",
}


@dataclass
class Finding:
    """One diagnosed cause: what, how bad, the numbers that show it, and the fix."""

    id: str
    severity: str
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    saving_ms: float | None = None
    detail: str = ""
    #: who pays ``saving_ms``: "request" (every request) or "first request" (once, at start)
    saving_per: str = "request"
    #: "measured" (the doctor tried the fix on the endpoint: saving_low_ms..saving_high_ms is
    #: its interval) or "estimated" (from what ``detail`` says); "" for no saving
    saving_basis: str = ""
    saving_low_ms: float | None = None
    saving_high_ms: float | None = None
    #: the interval's coverage (0.9 or more from five pairs of blocks; less with fewer, and said)
    saving_coverage: float | None = None
    #: the load the saving holds at: "c=1" (one caller), "c=8" (eight at once) ...
    saving_load: str = ""
    #: ``saving_ms`` as a share of the request's p50 at ``saving_load`` (None where that p50
    #: is not known, or the saving is paid once)
    saving_share: float | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ReportError(f"finding {self.id!r}: severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "finding") -> Finding:
        if not isinstance(data, dict):
            raise ReportError(f"{where}: expected an object, got {type(data).__name__}")
        missing = [k for k in ("id", "severity", "title") if k not in data]
        if missing:
            raise ReportError(f"{where}: missing {', '.join(missing)}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Report:
    """The result of a run. Build one with ``Recorder.report()`` or ``Report.load(path)``."""

    def __init__(
        self,
        *,
        latency: dict[str, Any],
        stages: dict[str, dict[str, Any]],
        findings: Iterable[Finding] = (),
        environment: dict[str, Any] | None = None,
        errors: dict[str, int] | None = None,
        distributions: dict[str, Distribution] | None = None,
        samples: list[dict[str, Any]] | None = None,
        meta: dict[str, Any] | None = None,
        created: str | None = None,
        load: Load | None = None,
        sweep: Sweep | None = None,
        diagnosis: Diagnosis | None = None,
        folded_stage_names: FoldedStages | None = None,
        streaming: Streaming | None = None,
        unknown: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.latency = latency
        self.stages = stages
        self.findings = list(findings)
        self.environment = environment if environment is not None else capture_environment()
        self.errors = errors or {}
        self.distributions = distributions or {}
        self.samples = samples or []
        self.meta = meta or {}
        self.created = created or _now()
        #: what ``servescope bench`` measured beside the statistics
        self.load = load
        #: several load levels: a row and a report per level
        self.sweep = sweep
        #: what ``servescope doctor`` concluded, and its evidence
        self.diagnosis = diagnosis
        #: stage names past the recorder's limit, counted together
        self.folded_stage_names = folded_stage_names
        #: what ``servescope.serve`` streamed: time to first chunk and between chunks
        self.streaming = streaming
        #: top-level keys this version does not know, kept as they are
        self.unknown: dict[str, Any] = dict(unknown or {})
        self.extra.update(extra or {})

    @property
    def extra(self) -> ExtraView:
        """The sections under their version-1 names, and the unknown keys: a mapping kept for
        scripts that read ``report.extra["throughput_rps"]``; read ``report.load`` ... instead."""
        return ExtraView(self)

    @extra.setter
    def extra(self, value: dict[str, Any]) -> None:
        for name in SECTIONS:
            setattr(self, name, None)
        self.unknown = {}
        self.extra.update(value)

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def from_distributions(
        cls,
        latency: Distribution,
        stages: dict[str, Distribution],
        *,
        first_ms: float | None = None,
        error_latency: Distribution | None = None,
        **kwargs: Any,
    ) -> Report:
        """Statistics computed from the distributions, which the report keeps for combining."""
        lat = summarize(latency)
        if first_ms is not None:
            lat["first_ms"] = round(first_ms, 4)
        total_sum = latency.mean() * len(latency) if len(latency) else 0.0
        stage_stats = {}
        for name in order_stages(stages):
            d = stages[name]
            s = summarize(d)
            stage_sum = d.mean() * len(d) if len(d) else 0.0
            s["share"] = round(stage_sum / total_sum, 4) if total_sum > 0 else None
            stage_stats[name] = s
        dists = {"total": latency, **{f"stage:{k}": stages[k] for k in stage_stats}}
        if error_latency is not None:
            dists["errors"] = error_latency
        return cls(latency=lat, stages=stage_stats, distributions=dists, **kwargs)

    @property
    def first_ms(self) -> float | None:
        return self.latency.get("first_ms")

    def stage_distributions(self) -> dict[str, Distribution]:
        return {k[6:]: v for k, v in self.distributions.items() if k.startswith("stage:")}

    def findings_by_severity(self) -> list[Finding]:
        """Findings worst first; within a severity, by the share of the request their saving
        is at its own load (a fix at one client and one at eight compare by share, not by
        ms), then those with no share by their saving."""
        return sorted(
            self.findings,
            key=lambda f: (SEVERITIES.index(f.severity), f.saving_share is None, -(f.saving_share or 0.0), -(f.saving_ms or 0.0)),
        )

    # -- combining ---------------------------------------------------------------------------
    @classmethod
    def combine(cls, reports: Iterable[Report], **meta: Any) -> Report:
        """One report from several runs, merging distributions (percentiles are never averaged).

        Every part has its rule: distributions, errors and samples joined; findings joined
        (one per id and title); the first report's environment and first request; each section
        by its own ``combine`` (sections/); an unknown key kept when every report that has it
        agrees. What cannot be merged is left out and named, with why, in
        ``meta["not_combined"]``; ``meta["combined"]`` keeps each report's meta."""
        reports = list(reports)
        if not reports:
            raise ReportError("combine() needs at least one report")
        for i, r in enumerate(reports):
            if "total" not in r.distributions:
                raise ReportError(
                    f"report {i} keeps no distributions, so its percentiles cannot be merged "
                    "(averaging percentiles would be wrong): record it again with servescope"
                )
        latency = reports[0].distributions["total"]
        stages: dict[str, Distribution] = {}
        errs: dict[str, int] = {}
        err_lat: Distribution | None = None
        for i, r in enumerate(reports):
            if i:
                latency = latency.merge(r.distributions["total"])
            for name, d in r.stage_distributions().items():
                stages[name] = stages[name].merge(d) if name in stages else d
            for kind, n in r.errors.items():
                errs[kind] = errs.get(kind, 0) + n
            if "errors" in r.distributions:
                e = r.distributions["errors"]
                err_lat = e if err_lat is None else err_lat.merge(e)
        firsts = [r.first_ms for r in reports if r.first_ms is not None]
        findings = {(f.id, f.title): f for r in reports for f in r.findings}
        notes: dict[str, str] = {}
        sections = {name: section.combine([getattr(r, name) for r in reports], notes) for name, section in SECTIONS.items()}
        unknown: dict[str, Any] = {}
        for key in dict.fromkeys(k for r in reports for k in r.unknown):
            values = [r.unknown[key] for r in reports if key in r.unknown]
            if all(v == values[0] for v in values):
                unknown[key] = values[0]
            else:
                notes[key] = "not written by servescope, and the reports disagree on it"
        if notes:
            meta = {**meta, "not_combined": notes}
        return cls.from_distributions(
            latency,
            stages,
            first_ms=firsts[0] if firsts else None,
            error_latency=err_lat,
            errors=errs,
            findings=findings.values(),
            environment=reports[0].environment,
            samples=[s for r in reports for s in r.samples],
            meta={"combined": [r.meta for r in reports], **meta},
            unknown=unknown,
            **sections,
        )

    # -- JSON --------------------------------------------------------------------------------
    def to_dict(self, *, distributions: bool = True, samples: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "created": self.created,
            "environment": self.environment,
            "latency": self.latency,
            "stages": self.stages,
            "findings": [f.to_dict() for f in self.findings_by_severity()],
            "errors": self.errors,
            "meta": self.meta,
        }
        for name in SECTIONS:
            section = getattr(self, name)
            if section is not None:
                out[name] = section.to_dict()
        out.update(self.unknown)
        if distributions:
            out["distributions"] = {k: d.to_dict() for k, d in self.distributions.items()}
        if samples:
            out["samples"] = self.samples
        return out

    def to_json(self, *, indent: bool = True, **kwargs: Any) -> str:
        opts = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if indent else 0)
        return orjson.dumps(self.to_dict(**kwargs), option=opts, default=_default).decode()

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (atomically: a crash never leaves half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, data: Any) -> Report:
        if not isinstance(data, dict):
            raise ReportError(f"a report is a JSON object, got {type(data).__name__}")
        version = _check_schema(data.get("schema"))
        for key, kind in (("latency", dict), ("stages", dict), ("findings", list)):
            if not isinstance(data.get(key), kind):
                raise ReportError(f"report field {key!r} is missing or not a JSON {kind.__name__}")
        dists = data.get("distributions") or {}
        if not isinstance(dists, dict):
            raise ReportError("report field 'distributions' is not an object")
        check_types(data)
        if version == 1:  # the tools' fields were at the top level: they go to their sections
            check_v1_fields(data)
            sections: dict[str, Any] = {}
            v1 = {k: data[k] for k in V1_FIELDS if data.get(k) is not None}
            known = _KNOWN | set(V1_FIELDS)
        else:
            sections = {
                name: section.from_dict(data[name]) for name, section in SECTIONS.items() if data.get(name) is not None
            }
            v1 = {}
            known = _KNOWN | set(SECTIONS)
        return cls(
            latency=data["latency"],
            stages=data["stages"],
            findings=[Finding.from_dict(f, where=f"findings[{i}]") for i, f in enumerate(data["findings"])],
            environment=data.get("environment") or {},
            errors=data.get("errors") or {},
            distributions={
                k: Distribution.from_dict(v, where=f"distributions.{k}") for k, v in dists.items()
            },
            samples=data.get("samples") or [],
            meta=data.get("meta") or {},
            created=data.get("created"),
            unknown={k: v for k, v in data.items() if k not in known},
            extra=v1,
            **sections,
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "report") -> Report:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ReportError(f"{source} is not valid JSON (truncated or corrupt?): {exc}") from None
        try:
            return cls.from_dict(data)
        except ReportError as exc:
            raise type(exc)(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """A saved report, or one a running server serves (``http://host:port/report``: a
        ``servescope serve`` app, or any replica of one on Ray, which answers for all of them)."""
        if isinstance(path, str) and "://" in path:
            return cls.fetch(path)
        path = Path(path)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ReportError(f"cannot read report {str(path)!r}: {exc.strerror or exc}") from None
        return cls.from_json(text, source=str(path))

    @classmethod
    def fetch(cls, url: str, *, timeout_s: float = FETCH_TIMEOUT_S, max_bytes: int = MAX_FETCH_BYTES) -> Report:
        """A report from a running server: http(s) only (redirects too, at most 5), at most
        ``max_bytes`` read, the whole fetch within ``timeout_s``; else ``ReportError``."""
        try:
            text = _get(url, timeout_s=timeout_s, max_bytes=max_bytes)
        except ReportError as exc:
            raise ReportError(f"cannot fetch a report from {url}: {exc}") from None
        return cls.from_json(text, source=url)

    def __repr__(self) -> str:
        lat = self.latency
        return (
            f"<Report n={lat.get('count')} p50={lat.get('p50_ms')}ms p95={lat.get('p95_ms')}ms "
            f"stages={len(self.stages)} findings={len(self.findings)}>"
        )


def _check_schema(schema: Any) -> int:
    """The report's schema version, or ``SchemaError``."""
    if not isinstance(schema, str) or "/" not in schema:
        raise SchemaError(f"not a servescope report: 'schema' is {schema!r}, expected {SCHEMA!r}")
    name, _, version = schema.rpartition("/")
    if name != SCHEMA_NAME or not version.isdigit():
        raise SchemaError(f"not a servescope report: schema {schema!r}, expected {SCHEMA!r}")
    if int(version) > SCHEMA_VERSION:
        raise SchemaError(
            f"report schema {schema!r} is newer than this servescope understands ({SCHEMA}): "
            "`pip install -U servescope`"
        )
    return int(version)


def _default(obj: Any) -> Any:
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__} in a report")


def _get(url: str, *, timeout_s: float, max_bytes: int, max_redirects: int = 5) -> bytes:
    """GET ``url`` with bounds a hostile server cannot stretch: a deadline for the whole
    exchange (a watchdog shuts the socket: a server dripping a byte at a time never ends a
    per-read timeout), a size cap, and http(s) only, redirects included."""
    import http.client
    import socket
    import threading
    import time
    from urllib.parse import urljoin, urlsplit

    deadline = time.monotonic() + timeout_s
    for _ in range(max_redirects + 1):
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ReportError(f"malformed URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ReportError(f"only http:// and https:// URLs are fetched, not {url[:200]!r}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(parts.hostname, port, timeout=remaining)
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname, port, timeout=remaining)
        )
        cut = threading.Event()

        def shut(conn: http.client.HTTPConnection = conn, cut: threading.Event = cut) -> None:
            cut.set()
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(remaining, shut)
        watchdog.daemon = True
        watchdog.start()
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", target, headers={"Accept": "application/json", "User-Agent": "servescope"})
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("location"):
                url = urljoin(url, response.getheader("location", ""))
                continue
            if response.status != 200:
                raise ReportError(f"HTTP {response.status} {response.reason}")
            length = response.getheader("content-length") or ""
            if length.isdigit() and int(length) > max_bytes:
                raise ReportError(f"the answer is {int(length):,} bytes, over the {max_bytes:,} bytes read at most")
            chunks, size = [], 0
            while chunk := response.read1(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise ReportError(f"the answer goes on past the {max_bytes:,} bytes read at most")
                chunks.append(chunk)
            if not cut.is_set():
                return b"".join(chunks)
        except (OSError, http.client.HTTPException) as exc:
            if not cut.is_set():
                raise ReportError(str(getattr(exc, "reason", None) or exc or type(exc).__name__)) from None
        finally:
            watchdog.cancel()
            conn.close()
        break  # the watchdog cut it
    else:
        raise ReportError(f"more than {max_redirects} redirects")
    raise ReportError(f"no complete answer within {timeout_s:g} s")
