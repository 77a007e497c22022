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
from . import causes, concurrency, generation, items, loads, memory, openmp, threads
from .savings import _served_p50, p50_at_loads, severity  # noqa: F401 - (importable from here as before)

Rule = Callable[[Evidence], list[Finding]]

#: Every rule by the cause it names, in the order they are run.
RULES: dict[str, Rule] = {
    "failing-requests": causes.failing_requests,
    "model-load-per-request": loads.model_load_per_request,
    "cold-start": loads.cold_start,
    "model-not-on-accelerator": causes.model_not_on_accelerator,
    "repeated-transfer": causes.repeated_transfer,
    "repeated-work": causes.repeated_work,
    "per-item-calls": items.per_item_calls,
    "no-batching": concurrency.no_batching,
    "padding-waste": causes.padding_waste,
    "training-mode": causes.training_mode,
    "grad-enabled": causes.grad_enabled,
    "no-kv-cache": generation.no_kv_cache,
    "whole-answer-decoded": generation.whole_answer_decoded,
    "slow-stages": causes.slow_stages,
    "event-loop-blocked": concurrency.event_loop_blocked,
    "gil-contention": concurrency.gil_contention,
    "thread-oversubscription": threads.thread_oversubscription,
    "openmp-spin-wait": openmp.openmp_spin_wait,
    "memory-churn": memory.memory_churn,
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
    cap_savings(out.findings, ev.p50_ms, p50_at_loads(ev))
    return out


#: Findings whose severity is the share of the request their saving is (the others rank by
#: what they are: a share of the request's stages, answers that change, a long stall).
SAVING_RANKED = {
    "model-load-per-request",
    "repeated-transfer",
    "repeated-work",
    "per-item-calls",
    "no-batching",
    "padding-waste",
    "grad-enabled",
    "no-kv-cache",
    "whole-answer-decoded",
    "gil-contention",
}


def cap_savings(findings: list[Finding], p50_ms: float, p50_at: dict[str, float] | None = None) -> None:
    """Savings that every request would see overlap (the same milliseconds can be claimed by
    two causes), so together they may not exceed the request's own p50 at the load they are
    stated at (``p50_at``: "c=1" -> the p50 of one caller, "c=8" -> of eight): when they
    would, each is scaled by the same factor and says so, and those ranked by their saving
    are ranked again on the scaled figure. Savings at different loads never add up. Each
    keeps its share of the p50 at its load (``saving_share``: how findings of one severity are
    ordered, as milliseconds at one client and at eight are not the same unit): of the p50 its
    own blocks measured for a measured saving, else of ``p50_at``'s."""
    p50_at = {"c=1": p50_ms, **(p50_at or {})}
    loads: dict[str, list[Finding]] = {}
    for f in findings:
        if f.saving_ms and f.saving_per == "request":
            loads.setdefault(f.saving_load or "c=1", []).append(f)
    for load, group in loads.items():
        p50 = p50_at.get(load) or 0.0
        _cap(group, p50)
        for f in group:
            if f.saving_share is None and p50 > 0:
                f.saving_share = round((f.saving_ms or 0.0) / p50, 4)


def _cap(per_request: list[Finding], p50_ms: float) -> None:
    """Measured savings keep their figure (they are what the fix did, alone); estimated ones
    share what the measured ones leave of the request. Only measured savings that together
    exceed the request are scaled among themselves."""
    if not p50_ms:
        return
    measured = [f for f in per_request if f.saving_basis == "measured"]
    estimated = [f for f in per_request if f.saving_basis != "measured"]
    total_measured = sum(f.saving_ms or 0.0 for f in measured)
    if len(measured) > 1 and total_measured > p50_ms:  # (one alone is what its own blocks saved)
        _scale(measured, p50_ms, total_measured, p50_ms)
        total_measured = p50_ms
    left = max(p50_ms - total_measured, 0.0)
    total = sum(f.saving_ms or 0.0 for f in estimated)
    if total > left:
        _scale(estimated, left, total, p50_ms)


def _scale(group: list[Finding], budget: float, total: float, p50_ms: float) -> None:
    factor = budget / total
    for f in group:
        alone = f.saving_ms or 0.0
        f.saving_ms = round(alone * factor, 3)
        f.detail = (f.detail + " " if f.detail else "") + (
            f"Alone it would save about {alone:g} ms; with the other findings' savings it would be more than the "
            f"{p50_ms:.4g} ms request (they overlap), so it is scaled by {factor:.2f}."
        )
        if f.saving_low_ms is not None and f.saving_high_ms is not None:
            f.saving_low_ms, f.saving_high_ms = round(f.saving_low_ms * factor, 3), round(f.saving_high_ms * factor, 3)
        if f.saving_share is not None:
            f.saving_share = round(f.saving_share * factor, 4)
        if f.id in SAVING_RANKED:  # (a measured saving by the low end of its interval, as the rules rank it)
            banked = f.saving_ms if f.saving_low_ms is None else min(f.saving_ms, max(f.saving_low_ms, 0.0))
            f.severity = severity(banked, p50_ms)


def diagnose_report(report: Report) -> list[Finding]:
    """Diagnose a report from its evidence; records what was not checked in
    ``report.diagnosis.not_checked`` and returns the findings."""
    diagnosis = diagnose_evidence(Evidence.from_report(report))
    if report.diagnosis is not None:  # (Evidence.from_report found one)
        report.diagnosis.not_checked = dict(diagnosis.not_checked)
    return diagnosis.findings


__all__ = ["Diagnosis", "RULES", "Rule", "cap_savings", "diagnose_evidence", "diagnose_report"]
