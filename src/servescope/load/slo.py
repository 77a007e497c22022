"""Service-level objectives: ``--slo "p99<200ms,ttft_p95<500ms,itl_p99<50ms"``, judged twice.

    slo = SLO.parse("p99<200ms,ttft_p95<500ms")
    slo.request_met(latency_ms=120.0, ttfb_ms=3.0, ttft_ms=310.0, gaps_ms=gaps)   # goodput
    checks = judge(slo, report)                                                    # the run

Each objective is ``[METRIC_]STAT OP VALUE UNIT``: METRIC is ``latency`` (the default, end to
end), ``ttfb``, ``ttft``, ``itl`` or ``tpot``; STAT is ``pQ`` (``p50``, ``p99``, ``p99.9``),
``mean`` or ``max``; OP is ``<`` or ``<=``; UNIT is ``us``, ``ms`` or ``s``.

- **The run** meets an objective when the statistic over all its samples does: ``p99<200ms``
  when the run's p99 latency is under 200 ms, ``itl_p99<50ms`` when the p99 of every gap of
  every request is. The run meets the SLO when it meets every objective; a figure the run did
  not measure (TTFT of responses that were not streamed) is not met. Failed requests met no
  objective: a ``pQ`` objective is missed when more than (100 - Q)% of the requests failed,
  a ``mean`` or ``max`` one when any did.
- **A request** is *good* when it succeeded and its own figures meet every objective, the
  statistic taken over its own samples: one latency, one TTFT, one TTFB (so the percentile
  does not matter), its own gaps for ``itl`` (``itl_p99<50ms``: the p99 of its gaps; a
  request with fewer than two tokens has none, and meets it), its own mean gap for ``tpot``.
  Goodput is good requests per second of the measured window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..exceptions import ConfigError
from ..sections import SloCheck

if TYPE_CHECKING:
    from ..report import Report
    from ..stats import Distribution

__all__ = ["METRICS", "Objective", "SLO", "judge"]

#: metric -> what it is
METRICS = {
    "latency": "end-to-end latency",
    "ttfb": "time to first byte (the response's head)",
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "tpot": "time per output token",
}
_TERM = re.compile(r"^(?:(latency|ttfb|ttft|itl|tpot)_)?(p\d+(?:\.\d+)?|mean|max)\s*(<=|<)\s*(\d+(?:\.\d+)?)\s*(us|ms|s)$")
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class Objective:
    """One term of an SLO: ``metric``'s ``stat`` below ``limit_ms`` (or at it, ``inclusive``)."""

    metric: str
    stat: str
    limit_ms: float
    inclusive: bool
    text: str

    def met_by(self, value_ms: float) -> bool:
        return value_ms <= self.limit_ms if self.inclusive else value_ms < self.limit_ms

    def of(self, values: np.ndarray) -> float:
        """This objective's statistic of ``values`` (ms; not empty)."""
        if self.stat == "mean":
            return float(values.mean())
        if self.stat == "max":
            return float(values.max())
        return float(np.percentile(values, float(self.stat[1:])))

    def of_distribution(self, d: Distribution) -> float:
        if self.stat == "mean":
            return d.mean()
        if self.stat == "max":
            return d.max()
        return d.percentile(float(self.stat[1:]))

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class SLO:
    """Objectives every one of which a run (and a good request) must meet; ``SLO.parse`` reads
    the ``--slo`` text and refuses, with a ``ConfigError`` naming the term, anything else."""

    objectives: tuple[Objective, ...]

    @classmethod
    def parse(cls, text: str) -> SLO:
        terms = [t.strip() for t in str(text).split(",")]
        objectives: list[Objective] = []
        seen = set()
        for term in terms:
            m = _TERM.match(term)
            if not m:
                raise ConfigError(
                    f"bad SLO term {term!r} in {text!r}: expected [latency_|ttfb_|ttft_|itl_|tpot_]STAT<VALUE with STAT "
                    "p50, p99, p99.9, mean or max and a unit us, ms or s, e.g. p99<200ms,ttft_p95<500ms,itl_p99<50ms"
                )
            metric, stat, op, value, unit = m.group(1) or "latency", m.group(2), m.group(3), m.group(4), m.group(5)
            if stat.startswith("p") and not 0 < float(stat[1:]) <= 100:
                raise ConfigError(f"bad SLO term {term!r}: a percentile is between p0 and p100 (exclusive of p0)")
            if stat == "p100":
                stat = "max"
            if (metric, stat) in seen:
                raise ConfigError(f"bad SLO {text!r}: {metric} {stat} is given twice")
            seen.add((metric, stat))
            objectives.append(Objective(metric, stat, float(value) * _UNIT[unit], op == "<=", term.replace(" ", "")))
        return cls(tuple(objectives))

    @property
    def streamed(self) -> bool:
        """True when an objective needs streamed responses (TTFB, TTFT, ITL, TPOT)."""
        return any(o.metric != "latency" for o in self.objectives)

    def request_met(
        self,
        *,
        latency_ms: float,
        ttfb_ms: float | None = None,
        ttft_ms: float | None = None,
        gaps_ms: np.ndarray | None = None,
        tpot_ms: float | None = None,
    ) -> bool:
        """Whether one successful request's own figures meet every objective (module docstring);
        ``gaps_ms`` None: the response was not streamed, so stream objectives are not met."""
        for o in self.objectives:
            if o.metric == "latency":
                value: float | None = latency_ms
            elif o.metric == "ttfb":
                value = ttfb_ms
            elif o.metric == "ttft":
                value = ttft_ms
            elif gaps_ms is None:
                return False
            elif gaps_ms.size == 0:
                continue
            elif o.metric == "itl":
                value = o.of(gaps_ms)
            else:  # tpot: its own mean gap as observed
                value = tpot_ms
            if value is None or not o.met_by(value):
                return False
        return True

    def __str__(self) -> str:
        return ",".join(o.text for o in self.objectives)


def judge(slo: SLO, report: Report) -> list[SloCheck]:
    """Each objective judged on the run: its statistic over all the run's samples, from the
    report's distributions (so a combined report can be judged again)."""
    from ..stats import Distribution

    stream = report.load.stream if report.load is not None else None
    requests = report.load.requests if report.load is not None else None
    failed = sum(report.errors.values())
    measured = requests.measured if requests is not None and requests.measured else failed + int(report.latency.get("count") or 0)
    out = []
    for o in slo.objectives:
        allowed = 0.0 if o.stat in ("max", "mean") else 1 - float(o.stat[1:]) / 100
        if failed and failed > allowed * measured:
            out.append(SloCheck(objective=o.text, value_ms=None, met=False,
                                note=f"{failed} of {measured} requests failed, more than {o.stat} allows"))  # fmt: skip
            continue
        d: Distribution | None
        if o.metric == "latency":
            d = report.distributions.get("total")
        elif stream is None:
            d = None
        elif o.metric == "tpot":
            d = stream.distribution("tpot")
        else:
            d = stream.distribution(o.metric)
        if d is None or len(d) == 0:
            why = "no successful request" if o.metric == "latency" or stream is not None else "no response was streamed"
            out.append(SloCheck(objective=o.text, value_ms=None, met=False, note=f"not measured: {why}"))
            continue
        value = o.of_distribution(d)
        out.append(SloCheck(objective=o.text, value_ms=round(value, 4), met=o.met_by(value)))
    return out
