"""Before and after: two reports side by side, and whether each change beats the noise.

    table = compare(Report.load("before.json"), Report.load("after.json"))

Each row has the figure before and after, the ratio, and ``significant``: a Mann-Whitney
rank-sum test on the two runs' samples (|z| > 3, about p < 0.003), when both reports kept
their samples; ``None`` when they did not (a sketch or a hand-made report).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .report import Report
from .stats import Distribution

__all__ = ["compare", "rank_sum_z"]


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


def _row(name: str, before: Any, after: Any, significant: bool | None, *, higher_is_better: bool = False) -> dict[str, Any]:
    ratio = after / before if before and after is not None else None
    better = None
    if ratio is not None and significant:
        better = ratio > 1 if higher_is_better else ratio < 1
    return {"metric": name, "before": before, "after": after, "ratio": None if ratio is None else round(ratio, 3), "significant": significant, "better": better}


def compare(before: Report, after: Report) -> dict[str, Any]:
    """Rows for end-to-end latency, throughput and each stage's mean."""
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
    return {"summary": rows, "stages": stages, "before": before.meta.get("title"), "after": after.meta.get("title")}
