"""Before and after: two reports side by side, and whether each change beats the noise.

    comparison = compare(Report.load("before.json"), Report.load("after.json"))
    p50 = comparison.summary[0]          # Change(metric="p50 latency ms", before=..., after=..., ...)
    print(ComparisonRenderer().render(comparison))

Each ``Change`` has the figure before and after, the ratio, and ``significant``: a
Mann-Whitney rank-sum test on the two runs' samples (|z| > 3, about p < 0.003), when both
reports kept their samples; ``None`` when they did not (a sketch or a hand-made report).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .report import Report
from .stats import Distribution

__all__ = ["Change", "Comparison", "compare", "rank_sum_z"]


def rank_sum_z(a: np.ndarray, b: np.ndarray) -> float:
    """The Mann-Whitney U statistic's z-score (normal approximation, mid-ranks for ties)."""
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return math.nan
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    ranks[order] = np.arange(1, len(both) + 1)
    # mid-ranks for ties
    sorted_vals = both[order]
    _, start, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    for s, c in zip(start, counts):
        if c > 1:
            ranks[order[s : s + c]] = s + (c + 1) / 2
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return (u - mean) / sd if sd else math.nan


def _significant(a: Distribution | None, b: Distribution | None) -> bool | None:
    if a is None or b is None or not a.exact or not b.exact:
        return None
    z = rank_sum_z(a.values(), b.values())
    return None if math.isnan(z) else bool(abs(z) > 3)


@dataclass(frozen=True)
class Change:
    """One figure before and after: ``ratio`` is after / before (None without both);
    ``significant`` whether the change beats the noise (None: no samples to tell);
    ``better`` True or False only for a significant change."""

    metric: str
    before: float | None
    after: float | None
    ratio: float | None
    significant: bool | None
    better: bool | None


@dataclass(frozen=True)
class Comparison:
    """Two reports side by side: end-to-end figures (latency percentiles, throughput) in
    ``summary``, each stage's mean in ``stages`` (stages of either report, in order)."""

    before: Report
    after: Report
    summary: tuple[Change, ...]
    stages: tuple[Change, ...]

    def to_dict(self) -> dict[str, Any]:
        """The table as plain data (the form ``compare()`` returned before ``Comparison``)."""
        return {
            "summary": [dataclasses.asdict(c) for c in self.summary],
            "stages": [dataclasses.asdict(c) for c in self.stages],
            "before": self.before.meta.get("title"),
            "after": self.after.meta.get("title"),
        }

    def __getitem__(self, key: str) -> Any:
        warnings.warn(
            f"compare() returns a Comparison, not a dict: use comparison.{key} (or .to_dict()[{key!r}])",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.to_dict()[key]


def _row(name: str, before: Any, after: Any, significant: bool | None, *, higher_is_better: bool = False) -> Change:
    ratio = after / before if before and after is not None else None
    better = None
    if ratio is not None and significant:
        better = ratio > 1 if higher_is_better else ratio < 1
    return Change(name, before, after, None if ratio is None else round(ratio, 3), significant, better)


def compare(before: Report, after: Report) -> Comparison:
    """End-to-end latency, throughput and each stage's mean, before and after."""
    tb, ta = before.distributions.get("total"), after.distributions.get("total")
    sig = _significant(tb, ta)
    rows = [_row(f"{k} latency ms", before.latency.get(f"{k}_ms"), after.latency.get(f"{k}_ms"), sig) for k in ("p50", "p95", "p99", "mean")]
    tput_b, tput_a = before.extra.get("throughput_rps"), after.extra.get("throughput_rps")
    if tput_b is not None or tput_a is not None:
        rows.append(_row("throughput req/s", tput_b, tput_a, None, higher_is_better=True))
    sb, sa = before.stage_distributions(), after.stage_distributions()
    stages = []
    for name in dict.fromkeys([*before.stages, *after.stages]):
        mb = (before.stages.get(name) or {}).get("mean_ms")
        ma = (after.stages.get(name) or {}).get("mean_ms")
        stages.append(_row(name, mb, ma, _significant(sb.get(name), sa.get(name))))
    return Comparison(before, after, tuple(rows), tuple(stages))
