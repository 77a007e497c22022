"""The section a sweep writes (``servescope bench`` with several levels, ``--find-max``):
``Sweep`` (the report's ``sweep``), its rows, and the search."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Section

__all__ = ["FindMax", "Sweep", "SweepRow"]


@dataclass(kw_only=True)
class SweepRow(Section):
    """One load level of a sweep: the throughput-latency curve's point."""

    level: float | None = None
    mode: str = "concurrency"
    throughput_rps: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    #: streamed responses: the median and p99 time to first token and gap between tokens
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    #: with ``--slo``: the goodput, and whether the level met every objective
    goodput_rps: float | None = None
    slo_met: bool | None = None


@dataclass(kw_only=True)
class FindMax(Section):
    """``--find-max``: the highest open-loop rate found to meet the SLO, and how the search ended."""

    slo: str = ""
    #: the highest rate that met it (null: none did)
    max_rate: float | None = None
    #: the lowest rate that missed it (null: none did)
    missed_rate: float | None = None
    #: the search stops when missed_rate / max_rate <= 1 + resolution
    resolution: float = 0.05
    budget_s: float | None = None
    elapsed_s: float | None = None
    #: "resolution reached", "time budget spent", "rate cap reached", "no rate met the SLO", "interrupted"
    stopped: str = ""


@dataclass(kw_only=True)
class Sweep(Section):
    """Several load levels in one run: a row per level, and each level's report (without its
    distributions or samples). Not combined: a sweep is one run's curve."""

    key: ClassVar[str] = "sweep"
    not_mergeable: ClassVar[str] = "a sweep is one run's levels; combine the levels' own reports instead"

    rows: list[SweepRow] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)
    #: ``--find-max``: the search the rows come from
    find_max: FindMax | None = None
