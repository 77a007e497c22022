"""Diagnosis rules: small pure functions, ``rule(evidence) -> list[Finding]``, one per cause.

They read only the doctor's typed ``Evidence`` (rebuilt from a Report, so they are tested
on hand-made evidence and can re-diagnose a saved report). A rule that needs a measurement
the run does not have raises ``MissingEvidence``: the cause is listed as not checked, with
the reason, never dropped silently; any other exception is a bug and propagates.
Thresholds: docs/doctor.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..doctor.evidence import Evidence, MissingEvidence
from ..report import Finding, Report
from . import causes

Rule = Callable[[Evidence], list[Finding]]

#: Every rule by the cause it names, in the order they are run.
RULES: dict[str, Rule] = {
    "failing-requests": causes.failing_requests,
    "model-load-per-request": causes.model_load_per_request,
    "cold-start": causes.cold_start,
    "model-not-on-accelerator": causes.model_not_on_accelerator,
    "repeated-transfer": causes.repeated_transfer,
    "no-batching": causes.no_batching,
    "training-mode": causes.training_mode,
    "grad-enabled": causes.grad_enabled,
    "slow-stages": causes.slow_stages,
    "event-loop-blocked": causes.event_loop_blocked,
    "gil-contention": causes.gil_contention,
    "thread-oversubscription": causes.thread_oversubscription,
}


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    #: rule -> why it could not be checked on this run
    not_checked: dict[str, str] = field(default_factory=dict)


def diagnose_evidence(ev: Evidence) -> Diagnosis:
    """Run every rule; then keep the per-request savings honest (see ``cap_savings``)."""
    out = Diagnosis()
    for name, rule in RULES.items():
        try:
            out.findings.extend(rule(ev))
        except MissingEvidence as exc:
            out.not_checked[name] = str(exc)
    cap_savings(out.findings, ev.p50_ms)
    return out


def cap_savings(findings: list[Finding], p50_ms: float) -> None:
    """Savings that every request would see overlap (the same milliseconds can be claimed by
    two causes), so together they may not exceed the request's own p50: the largest keep
    their estimate, later ones are cut to what is left, and say so."""
    if not p50_ms:
        return
    left = p50_ms
    for f in sorted(findings, key=lambda f: -(f.saving_ms or 0.0)):
        if f.saving_ms is None or f.saving_per != "request":
            continue
        if f.saving_ms > left:
            f.detail = (f.detail + " " if f.detail else "") + (
                f"Alone it would save about {f.saving_ms:g} ms; the causes above already account for "
                f"the rest of the {p50_ms:g} ms request."
            )
            f.saving_ms = round(max(left, 0.0), 3)
        left -= f.saving_ms


def diagnose_report(report: Report) -> list[Finding]:
    """Diagnose a report from its evidence; records what was not checked in
    ``report.extra["not_checked"]`` and returns the findings."""
    diagnosis = diagnose_evidence(Evidence.from_report(report))
    if diagnosis.not_checked:
        report.extra["not_checked"] = diagnosis.not_checked
    else:
        report.extra.pop("not_checked", None)
    return diagnosis.findings


__all__ = ["Diagnosis", "RULES", "Rule", "cap_savings", "diagnose_evidence", "diagnose_report"]
