"""The section ``servescope doctor`` writes: ``Diagnosis`` (the report's ``diagnosis``), its
verdict, and the share of time no stage accounts for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Section

__all__ = ["Diagnosis", "Unattributed", "Verdict"]


@dataclass(kw_only=True)
class Verdict(Section):
    """Whether the run measured enough to diagnose, and if not, why."""

    diagnosed: bool = True
    reason: str = ""
    #: failed requests by kind, all phases
    failures: dict[str, int] = field(default_factory=dict)
    #: for an app that answered 404/405: its routes ("POST /search") and what to pass
    routes: list[str] = field(default_factory=list)
    hint: str = ""


@dataclass(kw_only=True)
class Unattributed(Section):
    """The share of each request outside every stage the probes know (or, ``doctor --pid``,
    outside the sampled processes' Python: ``why`` says where it may be)."""

    share: float | None = None
    why: str = ""
    #: where the sampler found that time (``file:line function (share of the time, samples)``;
    #: "" where it saw none or the request called a model: then the stages' hot spots say)
    where: str = ""


@dataclass(kw_only=True)
class Diagnosis(Section):
    """What ``servescope doctor`` concluded and what it rests on. ``evidence`` is the doctor's
    ``Evidence`` in its JSON form (doctor/evidence.py; ``Evidence.from_report`` reads it, and
    checks it, where the rules need it). Not combined: a diagnosis is of one run's evidence."""

    key: ClassVar[str] = "diagnosis"
    not_mergeable: ClassVar[str] = "a diagnosis is of one run's evidence; diagnose each run, or the combined figures again"

    verdict: Verdict | None = None
    evidence: dict[str, Any] | None = None
    #: rule id -> why it was not checked
    not_checked: dict[str, str] = field(default_factory=dict)
    #: probe name -> why it was switched off mid-run
    probes_disabled: dict[str, str] = field(default_factory=dict)
    unattributed: Unattributed | None = None
    #: the first few failures, as the endpoint raised them
    endpoint_errors: list[str] = field(default_factory=list)
    #: the endpoint's last lines of output, when it could not start
    endpoint_output: list[str] = field(default_factory=list)
    #: how throughput scaled with callers (``--url``)
    scaling_note: str | None = None
