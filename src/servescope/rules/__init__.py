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
    "repeated-work": causes.repeated_work,
    "no-batching": causes.no_batching,
    "padding-waste": causes.padding_waste,
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


#: Findings whose severity is the share of the request their saving is (the others rank by
#: what they are: a share of the request's stages, answers that change, a long stall).
SAVING_RANKED = {
    "model-load-per-request",
    "repeated-transfer",
    "repeated-work",
    "no-batching",
    "padding-waste",
    "grad-enabled",
    "gil-contention",
}


def cap_savings(findings: list[Finding], p50_ms: float) -> None:
    """Savings that every request would see overlap (the same milliseconds can be claimed by
    two causes), so together they may not exceed the request's own p50: when they would,
    each is scaled by the same factor and says so, and those ranked by their saving are
    ranked again on the scaled figure."""
    from .causes import severity

    per_request = [f for f in findings if f.saving_ms and f.saving_per == "request"]
    total = sum(f.saving_ms or 0.0 for f in per_request)
    if not p50_ms or total <= p50_ms:
        return
    factor = p50_ms / total
    for f in per_request:
        alone = f.saving_ms or 0.0
        f.saving_ms = round(alone * factor, 3)
        f.detail = (f.detail + " " if f.detail else "") + (
            f"Alone it would save about {alone:g} ms; the per-request savings of all the findings add up to "
            f"{total:.4g} ms, more than the {p50_ms:.4g} ms request (they overlap), so each is scaled by {factor:.2f}."
        )
        if f.id in SAVING_RANKED:
            f.severity = severity(f.saving_ms, p50_ms)


def diagnose_report(report: Report) -> list[Finding]:
    """Diagnose a report from its evidence; records what was not checked in
    ``report.diagnosis.not_checked`` and returns the findings."""
    diagnosis = diagnose_evidence(Evidence.from_report(report))
    if report.diagnosis is not None:  # (Evidence.from_report found one)
        report.diagnosis.not_checked = dict(diagnosis.not_checked)
    return diagnosis.findings


__all__ = ["Diagnosis", "RULES", "Rule", "cap_savings", "diagnose_evidence", "diagnose_report"]
