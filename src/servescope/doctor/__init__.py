"""``servescope doctor``: run the user's endpoint under probes, then name the causes.

The parts, in the order a run uses them:

- ``endpoints/``: what is examined (a function, an ASGI app, a WSGI app), behind one ``Endpoint`` protocol;
- ``probes.py``: see inside the endpoint without changing what it does;
- ``sampler.py``: where each thread is, every 2 ms (hot spots, the loop's thread, the GIL);
- ``run.py``: the phases, each with a deadline, and the verdict (could it be diagnosed?);
- ``attribution.py``: unstaged time split into preprocess / postprocess / load;
- ``evidence.py``: what the phases measured, typed; the rules (``servescope.rules``) read it;
- ``isolate.py``: the command line's run, in a child process with a hard deadline;
- ``url.py``: the checks that work from outside a running endpoint.

Exit statuses of ``servescope doctor``: 0 diagnosed (no finding at ``--fail-on`` or
worse), 1 a finding at ``--fail-on`` or worse, 2 bad arguments, 3 could not diagnose.
"""

from __future__ import annotations

from typing import Any

from .evidence import Evidence, MissingEvidence
from .run import DoctorOptions, Verdict, diagnose
from .url import diagnose_url

__all__ = [
    "EXIT_DIAGNOSED",
    "EXIT_FINDINGS",
    "EXIT_UNDIAGNOSED",
    "EXIT_USAGE",
    "DoctorOptions",
    "Evidence",
    "MissingEvidence",
    "Verdict",
    "diagnose",
    "diagnose_url",
    "diagnosed",
    "exit_status",
]

EXIT_DIAGNOSED, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNDIAGNOSED = 0, 1, 2, 3


def exit_status(report: Any, fail_on: str | None = None) -> int:
    """The doctor's exit status for ``report``: 3 when it could not diagnose (whatever
    ``fail_on`` says), 1 when a finding is at ``fail_on`` or worse, else 0."""
    from ..report import SEVERITIES

    if not diagnosed(report):
        return EXIT_UNDIAGNOSED
    if fail_on is not None:
        worst = SEVERITIES.index(fail_on)
        if any(SEVERITIES.index(f.severity) <= worst for f in report.findings):
            return EXIT_FINDINGS
    return EXIT_DIAGNOSED


def diagnosed(report: Any) -> bool:
    """False when the run that made ``report`` said it could not diagnose (its verdict)."""
    verdict = report.diagnosis.verdict if report.diagnosis is not None else None
    return verdict is None or verdict.diagnosed
