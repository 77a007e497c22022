"""Diagnosis rules: small pure functions, ``rule(report) -> list[Finding]``, one per cause.

They read only the Report (its statistics and ``extra["evidence"]``), so they are tested on
hand-made reports and can re-diagnose a saved one. Thresholds: docs/doctor.md.
"""

from __future__ import annotations

from typing import Callable

from ..report import Finding, Report
from .causes import (
    cold_start,
    event_loop_blocked,
    grad_enabled,
    model_load_per_request,
    model_not_on_accelerator,
    no_batching,
    repeated_transfer,
    slow_stages,
    thread_oversubscription,
    training_mode,
)

Rule = Callable[[Report], list[Finding]]

#: Every rule, in the order they are run.
RULES: list[Rule] = [
    model_load_per_request,
    cold_start,
    model_not_on_accelerator,
    repeated_transfer,
    no_batching,
    training_mode,
    grad_enabled,
    slow_stages,
    event_loop_blocked,
    thread_oversubscription,
]


def diagnose_report(report: Report) -> list[Finding]:
    """Run every rule on the report; a rule that fails is skipped, never fatal."""
    findings: list[Finding] = []
    for rule in RULES:
        try:
            findings.extend(rule(report))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # evidence this rule needs is missing (an older or partial report)
    return findings


__all__ = ["RULES", "Rule", "diagnose_report"]
