"""Hand-written SVG charts for the HTML page: axes with round ticks in units, lines labelled
at their ends, bars; and the binning of a latency histogram.

    x = Axis.fit([0, 9.8], unit="s"); y = Axis.fit([1.2, 480], unit="ms")
    svg = line_chart([Series("p99", xs, ys)], x=x, y=y, xlabel="time into the run", ylabel="latency")

Every chart is well-formed XML (tests parse it): each series is a ``<g class="series"
data-name=...>`` holding its line and its label, each bar a ``<rect data-count=...>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Sequence

import numpy as np

from ..stats import Distribution

__all__ = [
    "COLORS", "Axis", "Bar", "Series", "bar_chart", "end_labels", "histogram_bins", "label_room", "line_chart", "log_scale",
    "nice_step", "tick_label",
]  # fmt: skip

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
#: A latency axis turns logarithmic when its largest value passes this many times its smallest.
LOG_ABOVE = 20.0
#: A histogram never has more bars than this.
MAX_BINS = 60
#: The height of one line of label text, and so the least gap between two labels (px).
LINE_PX = 13


def nice_step(span: float, ticks: int = 6) -> float:
    """The round step (1, 2 or 5 times a power of ten) that cuts ``span`` into the number of
    parts nearest ``ticks`` - 1 (the finer step on a tie)."""
    raw = span / max(ticks - 1, 1)
    if not raw > 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    steps = [m * power for m in (0.5, 1, 2, 5, 10)]
    return min(steps, key=lambda st: (abs(math.ceil(span / st - 1e-9) - (ticks - 1)), -span / st))


def tick_label(value: float, unit: str, step: float | None = None) -> str:
    """``value`` in ``unit``, with as many decimals as the step between ticks needs."""
    if step is not None and step > 0:
        text = f"{value:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"
    else:
        text = f"{value:g}"
    if unit in ("%", ""):
        return text + unit
    return f"{text} {unit}"


def log_scale(values: Sequence[float]) -> bool:
    """Whether latencies this spread read better on a logarithmic axis."""
    pos = [v for v in values if v is not None and v > 0]
    return bool(pos) and max(pos) / min(pos) > LOG_ABOVE


@dataclass
class Axis:
    """A value range, its ticks and their unit; linear or logarithmic."""

    lo: float
    hi: float
    unit: str = ""
    log: bool = False
    ticks: list[float] = field(default_factory=list)
    step: float | None = None  # between linear ticks, for their decimals

    @classmethod
    def fit(
        cls, values: Sequence[float], *, unit: str, log: bool = False, zero: bool = True, integer: bool = False, ticks: int = 6
    ) -> Axis:
        """The axis that holds ``values``, its ends on round ticks (from 0 when ``zero``)."""
        vals = [float(v) for v in values if v is not None and math.isfinite(v)] or [0.0]
        if log:  # the data's own range (a round end could waste half the width), ticks at round values inside
            pos = [v for v in vals if v > 0] or [1.0]
            lo, hi = min(pos), max(pos)
            hi = hi if hi > lo * 1.5 else lo * 1.5
            marks = [m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2) for m in (1, 2, 5)]
            inside = [m for m in marks if lo * (1 - 1e-9) <= m <= hi * (1 + 1e-9)]
            decades = [m for m in inside if math.isclose(m, 10 ** round(math.log10(m)))]
            shown = inside if 2 <= len(inside) <= 10 else decades if len(decades) >= 2 else [lo, hi]
            return cls(lo, hi, unit, True, shown)
        lo, hi = (min(0.0, min(vals)) if zero else min(vals)), max(vals)
        step = nice_step(hi - lo if hi > lo else abs(hi) or 1.0, ticks)
        if integer:
            step = max(1.0, round(step))
        lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
        if hi <= lo:
            hi = lo + step
        count = round((hi - lo) / step)
        return cls(lo, hi, unit, False, [lo + i * step for i in range(count + 1)], step)

    def frac(self, v: float) -> float:
        """Where ``v`` falls between the ends: 0 at ``lo``, 1 at ``hi``."""
        if self.log:
            v = max(v, self.lo * 1e-3)
            return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def label(self, v: float) -> str:
        return tick_label(v, self.unit, None if self.log else self.step)


@dataclass
class Series:
    """One line: its name (drawn at its right end), its points, and how it is drawn;
    a None in ``ys`` breaks the line."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str = COLORS[0]
    dashed: bool = False
    markers: bool = False
    #: a tooltip per point (the load level of a sweep's point ...)
    tips: Sequence[str] = ()


@dataclass
class Bar:
    """One bar: from ``x0`` to ``x1``, ``count`` high (stacked: ``parts`` of count and color)."""

    x0: float
    x1: float
    parts: list[tuple[int, str]]
    tip: str = ""


class _Frame:
    """The plot area of a chart and its axes."""

    def __init__(self, x: Axis, y: Axis, *, width: int, height: int, right: int = 20) -> None:
        self.x, self.y, self.width, self.height = x, y, width, height
        self.left, self.right, self.top, self.bottom = 70, right, 12, 42

    def px(self, v: float) -> float:
        return self.left + self.x.frac(v) * (self.width - self.left - self.right)

    def py(self, v: float) -> float:
        return self.height - self.bottom - self.y.frac(v) * (self.height - self.bottom - self.top)

    def axes(self, xlabel: str, ylabel: str) -> list[str]:
        b, r = self.height - self.bottom, self.width - self.right
        out = ['<g class="axes" stroke="#ddd">']
        for t in self.y.ticks:
            out.append(f'<line x1="{self.left}" y1="{self.py(t):.1f}" x2="{r}" y2="{self.py(t):.1f}"/>')
        out.append("</g>")
        out.append(f'<line x1="{self.left}" y1="{b}" x2="{r}" y2="{b}" stroke="#888"/>')
        out.append(f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{b}" stroke="#888"/>')
        for t in self.y.ticks:
            out.append(f'<text class="ytick" x="{self.left - 6}" y="{self.py(t) + 4:.1f}" text-anchor="end">{escape(self.y.label(t))}</text>')
        for t in self.x.ticks:
            out.append(f'<text class="xtick" x="{self.px(t):.1f}" y="{b + 16}" text-anchor="middle">{escape(self.x.label(t))}</text>')
        out.append(f'<text x="{(self.left + r) / 2:.0f}" y="{self.height - 6}" text-anchor="middle">{escape(xlabel)}</text>')
        mid = (self.top + b) / 2
        out.append(f'<text x="14" y="{mid:.0f}" transform="rotate(-90 14 {mid:.0f})" text-anchor="middle">{escape(ylabel)}</text>')
        return out

    def svg(self, body: list[str], *, xlabel: str, ylabel: str, title: str) -> str:
        head = f'<svg width="{self.width}" height="{self.height}" role="img" aria-label="{escape(title)}">'
        return "".join([head, *self.axes(xlabel, ylabel), *body, "</svg>"])


def end_labels(ends: Sequence[float], *, top: float, bottom: float, gap: float = LINE_PX) -> list[float]:
    """Where to write the labels of lines ending at heights ``ends`` (px, down the page): each
    near its line, at least ``gap`` apart, in the lines' order from top to bottom."""
    order = sorted(range(len(ends)), key=lambda i: (ends[i], i))
    placed = [0.0] * len(ends)
    floor = top
    for i in order:  # push down past the label above
        placed[i] = max(ends[i], floor)
        floor = placed[i] + gap
    ceiling = bottom
    for i in reversed(order):  # then up, off the bottom edge
        placed[i] = min(placed[i], ceiling)
        ceiling = placed[i] - gap
    return placed


def label_room(names: Sequence[str]) -> int:
    """The right margin (px) that holds these line labels: give it to a chart drawn under a
    line chart so their x axes line up."""
    return 20 + 7 * max((len(n) for n in names), default=0)


def line_chart(series: Sequence[Series], *, x: Axis, y: Axis, xlabel: str, ylabel: str, title: str = "",
               width: int = 900, height: int = 300, below: Sequence[str] = ()) -> str:  # fmt: skip
    """Lines on ``x`` and ``y``, each named at its right end (the names in the lines' order)."""
    frame = _Frame(x, y, width=width, height=height, right=label_room([s.name for s in series]))
    body = list(below)
    ends: list[float] = []
    for s in series:
        pts = [(xv, yv) for xv, yv in zip(s.xs, s.ys) if yv is not None]
        ends.append(frame.py(pts[-1][1]) if pts else frame.py(y.lo))
    where = end_labels(ends, top=frame.top + 4, bottom=height - frame.bottom)
    for s, at in zip(series, where):
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        body.append(f'<g class="series" data-name="{escape(s.name)}">')
        run: list[tuple[float, float]] = []  # the points since the last gap
        last = None
        for xv, yv in [*zip(s.xs, s.ys), (None, None)]:
            if yv is not None:
                run.append((frame.px(xv), frame.py(yv)))
                last = xv
                continue
            if len(run) == 1:  # a point between two gaps: a dot, or it would not show
                body.append(f'<circle cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}" r="2" fill="{s.color}"/>')
            elif run:
                points = " ".join(f"{a:.1f},{b:.1f}" for a, b in run)
                body.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="2"{dash} points="{points}"/>')
            run = []
        if s.markers:
            for i, (xv, yv) in enumerate(zip(s.xs, s.ys)):
                if yv is not None:
                    tip = f"<title>{escape(s.tips[i])}</title>" if i < len(s.tips) else ""
                    body.append(f'<circle cx="{frame.px(xv):.1f}" cy="{frame.py(yv):.1f}" r="3.5" fill="{s.color}">{tip}</circle>')
        lx = frame.px(last) + 6 if last is not None else width - frame.right + 6
        body.append(f'<text class="label" x="{lx:.1f}" y="{at + 4:.1f}" fill="{s.color}">{escape(s.name)}</text></g>')
    return frame.svg(body, xlabel=xlabel, ylabel=ylabel, title=title or ylabel)


def bar_chart(bars: Sequence[Bar], *, x: Axis, y: Axis, xlabel: str, ylabel: str, title: str = "",
              width: int = 900, height: int = 240, right: int = 30) -> str:  # fmt: skip
    """Bars from ``x0`` to ``x1`` (stacked parts), each with its count as ``data-count``."""
    frame = _Frame(x, y, width=width, height=height, right=right)
    body = ['<g class="bars">']
    for bar in bars:
        x0, x1 = frame.px(bar.x0), frame.px(bar.x1)
        base = 0
        total = sum(n for n, _ in bar.parts)
        tip = f"<title>{escape(bar.tip)}</title>" if bar.tip else ""
        for n, color in bar.parts:
            if n <= 0:
                continue
            y0, y1 = frame.py(base + n), frame.py(base)
            body.append(f'<rect x="{x0 + 0.5:.1f}" y="{y0:.1f}" width="{max(x1 - x0 - 1, 0.8):.1f}" height="{y1 - y0:.1f}" '
                        f'fill="{color}" data-count="{n}">{tip}</rect>')  # fmt: skip
            base += n
        if not total and tip:  # an empty bar still says what it is, on hover
            body.append(f'<rect x="{x0:.1f}" y="{frame.top}" width="{max(x1 - x0, 0.8):.1f}" '
                        f'height="{height - frame.bottom - frame.top}" fill="transparent" data-count="0">{tip}</rect>')  # fmt: skip
    body.append("</g>")
    return frame.svg(body, xlabel=xlabel, ylabel=ylabel, title=title or ylabel)


def histogram_bins(d: Distribution, *, max_bins: int = MAX_BINS) -> tuple[np.ndarray, list[int], bool]:
    """Bin edges (ms), the integer count in each bin (they add up to ``len(d)``), and whether
    the bins are logarithmic (latencies spread over more than ``LOG_ABOVE`` times).

    The number of bins suits the sample size: the Freedman-Diaconis width (twice the
    interquartile range over the cube root of n, on the log scale when the bins are), never
    more than the square root of n (a bar per few samples says nothing), nor ``max_bins``.
    A sketch (over 100,000 samples) is binned by its counts, as exactly as it keeps them."""
    n = len(d)
    if n == 0:
        return np.empty(0), [], False
    lo, hi = d.min(), d.max()
    log = lo > 0 and hi / lo > LOG_ABOVE
    f, inv = (np.log10, lambda a: 10.0**a) if log else ((lambda a: np.asarray(a, dtype=float)), (lambda a: a))
    if not hi > lo:
        edges = np.array([lo, hi]) if hi > 0 else np.array([0.0, 1.0])
        return edges, [n], False
    q25, q75 = d.percentiles([25, 75])
    iqr = float(f(q75) - f(q25)) if q25 > 0 or not log else 0.0
    span = float(f(hi) - f(lo))
    fd = math.ceil(span / (2 * iqr * n ** (-1 / 3))) if iqr > 0 else max_bins
    bins = max(1, min(fd, math.ceil(math.sqrt(n)), max_bins))
    edges = np.asarray(inv(np.linspace(float(f(lo)), float(f(hi)), bins + 1)), dtype=float)
    edges[0], edges[-1] = lo, hi  # no sample lost to a rounding at either end
    below = d.count_le(edges)
    counts = [below[1]] + [below[i + 1] - below[i] for i in range(1, bins)]
    counts[-1] += n - below[-1]  # a sketch's top bucket may reach past the kept max
    return edges, [int(c) for c in counts], log
