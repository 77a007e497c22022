"""Before and after: two reports side by side, and whether each change beats the noise.

    comparison = compare(Report.load("before.json"), Report.load("after.json"))
    p50 = comparison.summary[0]          # Change(metric="p50 latency ms", before=..., after=..., ...)
    print(p50.words, p50.interval_words) # "1.84x faster", "1.71x-1.97x faster"
    print(ComparisonRenderer().render(comparison))

Whether a change beats the noise is decided from how much the figure moves *within* each run
over time, not from the per-request samples: requests a few milliseconds apart share the
machine's state, so tens of thousands of them are not tens of thousands of independent
observations (a rank test on them calls two runs of the same server "different"). Each run's
requests, in the order they completed, are cut into consecutive time blocks (at most 20, each
big enough for the figure: 30 requests for a median or mean, 60 for p95, 200 for p99); the
spread of the figure across blocks gives its standard error (batch means), and the change's
95% interval is the ratio after/before with both runs' errors, on a log scale, with Welch's
degrees of freedom. Runs also differ from each other by more than their blocks do (the same
server benched twice, two minutes apart, moved its p50 by 0.1-1.4% in five pairs here), so
"beyond noise" is the interval clearing a band of +-``NOISE_FLOOR`` (3%) around no change,
not only excluding it. Too few requests for the blocks, or a report without its samples: the
interval is unknown, never invented.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .report import Report
from .stats import Distribution

__all__ = ["Change", "Comparison", "compare", "ratio_interval", "rank_sum_z"]

#: At most this many time blocks per run, and at least this many to estimate a spread.
MAX_BLOCKS, MIN_BLOCKS = 20, 5
#: Run-to-run drift of an unchanged server, beyond what a run's own blocks show: a change is
#: beyond noise only when its whole 95% interval is further from no change than this.
NOISE_FLOOR = 0.03
#: Requests per block each figure needs to be read in a block at all.
BLOCK_SIZE = {"p50": 30, "mean": 30, "p95": 60, "p99": 200}
_STAT: dict[str, Callable[[np.ndarray], float]] = {
    "p50": lambda v: float(np.percentile(v, 50)),
    "p95": lambda v: float(np.percentile(v, 95)),
    "p99": lambda v: float(np.percentile(v, 99)),
    "mean": lambda v: float(np.mean(v)),
}


def rank_sum_z(a: np.ndarray, b: np.ndarray) -> float:
    """The Mann-Whitney U statistic's z-score (normal approximation, mid-ranks for ties).
    Kept for callers; ``compare`` no longer uses it (see the module's docstring)."""
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return math.nan
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    ranks[order] = np.arange(1, len(both) + 1)
    sorted_vals = both[order]
    _, start, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    for s, c in zip(start, counts):
        if c > 1:
            ranks[order[s : s + c]] = s + (c + 1) / 2
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return (u - mean) / sd if sd else math.nan


def _t95(df: float) -> float:
    """Student's t for a two-sided 95% interval (Cornish-Fisher expansion: within 0.5% from
    4 degrees of freedom, which the block counts guarantee)."""
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _block_spread(values: np.ndarray, figure: str) -> tuple[float, int] | None:
    """The variance of the figure's log over the run (batch means) and the block count."""
    blocks = min(MAX_BLOCKS, len(values) // BLOCK_SIZE[figure])
    if blocks < MIN_BLOCKS:
        return None
    stat = _STAT[figure]
    per_block = np.array([stat(b) for b in np.array_split(values, blocks)])
    if (per_block <= 0).any():
        return None
    return float(np.var(np.log(per_block), ddof=1)) / blocks, blocks


def ratio_interval(before: np.ndarray, after: np.ndarray, figure: str) -> tuple[float, float] | None:
    """The 95% interval of the figure's ratio after / before, as factors around the ratio
    (``(low, high)``, to multiply it by), from the spread of the figure across each run's
    time blocks; None when a run is too short to tell."""
    sb, sa = _block_spread(before, figure), _block_spread(after, figure)
    if sb is None or sa is None:
        return None
    (vb, nb), (va, na) = sb, sa
    se = math.sqrt(vb + va)
    denominator = vb**2 / (nb - 1) + va**2 / (na - 1)
    df = (vb + va) ** 2 / denominator if denominator > 0 else float(nb + na - 2)
    half = _t95(max(df, 4.0)) * se
    return math.exp(-half), math.exp(half)


def _ratio_words(r: float, higher_is_better: bool) -> str:
    """A ratio after / before in words: "1.84x faster", "4.2% slower", "2.5x more"."""
    if r == 1:
        return "no change"
    if higher_is_better:
        word, k = ("more", r) if r > 1 else ("less", 1 / r if r else math.inf)
    else:
        word, k = ("slower", r) if r > 1 else ("faster", 1 / r if r else math.inf)
    if k == math.inf:
        return "none left" if higher_is_better else "gone"
    if k < 1.1:
        return f"{(k - 1) * 100:.1f}% {word}"
    return f"{k:.0f}x {word}" if k >= 100 else f"{k:.1f}x {word}" if k >= 10 else f"{k:.2f}x {word}"  # 3 figures


@dataclass(frozen=True)
class Change:
    """One figure before and after: ``ratio`` is after / before (None without both), ``low``
    and ``high`` its 95% interval (None when it cannot be told); ``significant`` whether the
    interval clears the run-to-run band, ``NOISE_FLOOR`` (None: cannot tell); ``better`` True
    or False only for a significant change."""

    metric: str
    before: float | None
    after: float | None
    ratio: float | None
    significant: bool | None
    better: bool | None
    low: float | None = None
    high: float | None = None
    higher_is_better: bool = False

    @property
    def words(self) -> str:
        """The change in words: "1.84x faster", "4.2% slower", "2.5x more" (throughput)."""
        return "-" if self.ratio is None else _ratio_words(self.ratio, self.higher_is_better)

    @property
    def interval_words(self) -> str:
        """The 95% interval in words: "1.71x-1.97x faster", "3.1% faster to 2.0% slower"; "-"
        when it cannot be told."""
        if self.low is None or self.high is None:
            return "-"
        ends = [_ratio_words(r, self.higher_is_better) for r in (self.low, self.high)]
        if ends[0] == ends[1]:
            return ends[0]
        (a, word_a), (b, word_b) = (e.split(" ", 1) for e in ends)
        if word_a == word_b and a[-1] in "x%" and b[-1] in "x%":  # "1.71x-1.97x faster", "2.2% to 1.26x faster"
            lo, hi = sorted((a, b), key=lambda x: float(x[:-1]) if x[-1] == "x" else 1 + float(x[:-1]) / 100)
            return f"{lo}-{hi} {word_a}" if lo[-1] == hi[-1] else f"{lo} to {hi} {word_a}"
        return f"{ends[0]} to {ends[1]}"


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

    @property
    def title(self) -> str:
        """What was compared, from the reports' own targets (or titles)."""
        names = [str(r.meta.get("target") or r.meta.get("title") or "a report") for r in (self.before, self.after)]
        return f"{names[0]}: before and after" if names[0] == names[1] else f"{names[0]} vs {names[1]}"

    @property
    def notes(self) -> list[str]:
        """What the table cannot say, and why: too few requests for an interval, a sweep of
        which only the last level is compared."""
        out = []
        runs = [r.distributions.get("total") for r in (self.before, self.after)]
        counts = [len(d) if d is not None and d.exact else 0 for d in runs]
        untold = [c.metric.replace(" latency ms", "").replace(" ms", "") for c in self.untold()]
        if untold:
            stats = dict.fromkeys(w for name in untold for w in name.split() if w in BLOCK_SIZE)
            need = ", ".join(f"{k} {MIN_BLOCKS * BLOCK_SIZE[k]:,}" for k in stats)
            out.append(
                f"can't tell for {', '.join(untold)}: an interval needs enough requests per run to cut into "
                f"{MIN_BLOCKS} blocks ({need}); these runs have {counts[0]:,} and {counts[1]:,} successful "
                "requests (kept as samples): measure longer"
            )
        for name, rep in (("before", self.before), ("after", self.after)):
            if rep.sweep is not None and rep.sweep.rows:
                levels = ", ".join(f"{r.mode}={r.level:g}" for r in rep.sweep.rows if r.level is not None)
                out.append(f"{name} is a sweep ({levels}): compared here is its last level only")
        loads = [_load_of(r) for r in (self.before, self.after)]
        if loads[0] and loads[1] and loads[0] != loads[1]:
            out.append(
                f"the runs were at different load ({loads[0]} before, {loads[1]} after): latency and throughput change "
                "with load, so this compares the loads as much as the code: bench both at the same load"
            )
        near = [c.metric.split(" ms")[0] for c in [*self.summary, *self.stages] if _within_floor(c)]
        if near:
            out.append(
                f"{', '.join(near)}: the interval excludes no change, but not the +-{NOISE_FLOOR:.0%} that runs of an "
                "unchanged server drift by, so it is not called beyond noise"
            )
        return out

    def untold(self) -> list[Change]:
        """The latency figures whose change cannot be told (too few requests, no samples)."""
        return [c for c in self.summary if not c.higher_is_better and c.significant is None and c.ratio is not None]

    def slower_than(self, share: float) -> list[Change]:
        """The latency figures slower by more than ``share`` (0.1: 10%) and beyond noise: what
        ``servescope compare --fail-if-slower 10%`` fails on."""
        return [
            c for c in self.summary
            if not c.higher_is_better and c.significant and c.ratio is not None and c.ratio > 1 + share
        ]  # fmt: skip

    def __getitem__(self, key: str) -> Any:
        warnings.warn(
            f"compare() returns a Comparison, not a dict: use comparison.{key} (or .to_dict()[{key!r}])",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.to_dict()[key]


def _load_of(report: Report) -> str | None:
    """How a bench run loaded its endpoint, as ``concurrency=8`` or ``rate=50`` (None: not said)."""
    for key in ("concurrency", "rate"):
        value = report.meta.get(key)
        if isinstance(value, (int, float)):
            return f"{key}={value:g}"
    return None


def _within_floor(c: Change) -> bool:
    """An interval that excludes no change but stays within the run-to-run band."""
    return c.significant is False and c.low is not None and c.high is not None and (c.low > 1 or c.high < 1)


def _row(name: str, before: Any, after: Any, spread: tuple[float, float] | None, *, higher_is_better: bool = False) -> Change:
    ratio = after / before if before and after is not None else None
    low = high = significant = better = None
    if spread is not None and ratio is not None:
        low, high = ratio * spread[0], ratio * spread[1]
        significant = low > 1 + NOISE_FLOOR or high < 1 / (1 + NOISE_FLOOR)
        if significant:
            better = ratio > 1 if higher_is_better else ratio < 1
    return Change(name, before, after, ratio, significant, better, low, high, higher_is_better)


def _values(d: Distribution | None) -> np.ndarray | None:
    return d.values() if d is not None and d.exact and len(d) else None


def _interval(before: Distribution | None, after: Distribution | None, figure: str) -> tuple[float, float] | None:
    vb, va = _values(before), _values(after)
    return ratio_interval(vb, va, figure) if vb is not None and va is not None else None


#: Streamed responses' figures compared (``load.stream``): (row, distribution, statistic).
STREAM_FIGURES = (("ttft p50 ms", "ttft", "p50"), ("ttft p99 ms", "ttft", "p99"), ("itl p50 ms", "itl", "p50"),
                  ("itl p99 ms", "itl", "p99"), ("tpot p50 ms", "tpot", "p50"))  # fmt: skip


def _stream_rows(before: Report, after: Report) -> list[Change]:
    """TTFT, ITL and TPOT (with intervals, as latency's) and tokens per second, when both runs
    streamed: a change in time to first token is the change a chat user sees."""
    sb = before.load.stream if before.load is not None else None
    sa = after.load.stream if after.load is not None else None
    if sb is None or sa is None:
        return []
    rows = []
    for name, dist, stat in STREAM_FIGURES:
        fb, fa = getattr(sb, dist), getattr(sa, dist)
        if fb is None or fa is None:
            continue
        spread = _interval(sb.distribution(dist), sa.distribution(dist), stat)
        rows.append(_row(name, fb.get(f"{stat}_ms"), fa.get(f"{stat}_ms"), spread))
    if sb.chunks_per_s is not None and sa.chunks_per_s is not None:
        rows.append(_row("tokens/s", sb.chunks_per_s, sa.chunks_per_s, None, higher_is_better=True))
    return rows


def compare(before: Report, after: Report) -> Comparison:
    """End-to-end latency, throughput and each stage's mean, before and after, each change
    with its 95% interval from the runs' own variation over time."""
    tb, ta = before.distributions.get("total"), after.distributions.get("total")
    rows = [
        _row(f"{k} latency ms", before.latency.get(f"{k}_ms"), after.latency.get(f"{k}_ms"), _interval(tb, ta, k))
        for k in ("p50", "p95", "p99", "mean")
    ]
    tput_b = before.load.throughput_rps if before.load is not None else None
    tput_a = after.load.throughput_rps if after.load is not None else None
    if tput_b is not None or tput_a is not None:
        rows.append(_row("throughput req/s", tput_b, tput_a, None, higher_is_better=True))
    rows += _stream_rows(before, after)
    sb, sa = before.stage_distributions(), after.stage_distributions()
    stages = []
    for name in dict.fromkeys([*before.stages, *after.stages]):
        mb = (before.stages.get(name) or {}).get("mean_ms")
        ma = (after.stages.get(name) or {}).get("mean_ms")
        stages.append(_row(name, mb, ma, _interval(sb.get(name), sa.get(name), "mean")))
    return Comparison(before, after, tuple(rows), tuple(stages))
