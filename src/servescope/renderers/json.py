"""The JSON view: the Report's documented contract (docs/report-schema.md)."""

from __future__ import annotations

from ..report import Report

__all__ = ["JSONRenderer", "render_json"]


class JSONRenderer:
    """The report as JSON text; ``distributions`` / ``samples`` False leave those out (smaller,
    but ``compare`` then cannot test significance).

        Path("r.json").write_text(JSONRenderer().render(report))
    """

    def __init__(self, *, distributions: bool = True, samples: bool = True) -> None:
        self.distributions = distributions
        self.samples = samples

    def __repr__(self) -> str:
        return f"JSONRenderer(distributions={self.distributions}, samples={self.samples})"

    def render(self, report: Report) -> str:
        return report.to_json(distributions=self.distributions, samples=self.samples)


def render_json(report: Report, *, distributions: bool = True, samples: bool = True) -> str:
    """``JSONRenderer(distributions=..., samples=...).render(report)``."""
    return JSONRenderer(distributions=distributions, samples=samples).render(report)
