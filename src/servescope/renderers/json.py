"""The JSON view: the Report's documented contract (docs/report-schema.md)."""

from __future__ import annotations

from ..report import Report


def render_json(report: Report, *, distributions: bool = True, samples: bool = True) -> str:
    return report.to_json(distributions=distributions, samples=samples)
