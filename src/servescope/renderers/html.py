"""A self-contained HTML page: headline, stage breakdown, latency distribution, sweep curve.

No scripts, no fonts, nothing fetched: inline CSS and SVG, so the file opens anywhere and can
be attached to a ticket.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Sequence

import numpy as np

from ..compare import Comparison
from ..report import Report
from ..sections import Load
from .terminal import stage_label

__all__ = ["ComparisonHTMLRenderer", "HTMLRenderer", "render_comparison_html", "render_html"]

_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:1.8em}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}.big{font-size:18px}.muted{color:#777}
.finding{border-left:4px solid #e15759;padding:4px 12px;margin:10px 0;background:#fafafa}
.finding.info,.finding.low{border-color:#76b7b2}.finding.medium{border-color:#edc948}
pre{background:#f4f4f4;padding:8px;overflow:auto}svg text{font:11px system-ui,sans-serif}
"""


def _f(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}" if x < 100 else f"{x:.0f}"


def _headline(rep: Report) -> str:
    lat = rep.latency
    parts = [
        f"<p class=big>Baseline p50 latency: <b>{_f(lat.get('p50_ms'))} ms</b> · p95: <b>{_f(lat.get('p95_ms'))} ms</b>"
        f" · p99: {_f(lat.get('p99_ms'))} ms · max: {_f(lat.get('max_ms'))} ms ({lat.get('count')} requests)</p>"
    ]
    load = rep.load or Load()
    if load.throughput_rps is not None:
        parts.append(f"<p>Throughput: <b>{load.throughput_rps:.1f} requests/s</b></p>")
    if lat.get("first_ms") is not None:
        parts.append(f"<p>First request: {_f(lat['first_ms'])} ms</p>")
    if rep.errors:
        errs = ", ".join(f"{html.escape(k)}: {v}" for k, v in rep.errors.items())
        parts.append(f"<p><b>Errors:</b> {errs}</p>")
    hint = load.server_timing.hint if load.server_timing is not None else None
    if hint:
        parts.append(f"<p class=muted>{html.escape(hint)}</p>")
    return "\n".join(parts)


def _stage_table(rep: Report) -> str:
    rows = ["<tr><th>stage</th><th>mean ms</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>share</th></tr>"]
    for name, s in rep.stages.items():
        share = "-" if s.get("share") is None else f"{s['share'] * 100:.1f}%"
        rows.append(
            f"<tr><td>{html.escape(stage_label(name))}</td>"
            + "".join(f"<td>{_f(s.get(k))}</td>" for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms"))
            + f"<td>{share}</td></tr>"
        )
    lat = rep.latency
    rows.append(
        "<tr><td><b>total</b></td>"
        + "".join(f"<td><b>{_f(lat.get(k))}</b></td>" for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms"))
        + "<td></td></tr>"
    )
    return "<table>" + "".join(rows) + "</table>"


def _stacked_bar(rep: Report, width: int = 900) -> str:
    stages = [(n, s) for n, s in rep.stages.items() if s.get("share")]
    if not stages:
        return ""
    x = 0.0
    out = [f'<svg width="{width}" height="64" role="img" aria-label="stage breakdown">']
    for i, (name, s) in enumerate(stages):
        w = s["share"] * width
        color = _COLORS[i % len(_COLORS)]
        out.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="28" fill="{color}"><title>{html.escape(stage_label(name))}: {_f(s["mean_ms"])} ms</title></rect>')
        if w > 60:
            out.append(f'<text x="{x + 4:.1f}" y="45">{html.escape(stage_label(name))}</text>')
            out.append(f'<text x="{x + 4:.1f}" y="59">{_f(s["mean_ms"])} ms</text>')
        x += w
    out.append("</svg>")
    return "".join(out)


def _line_chart(
    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    width: int = 900,
    height: int = 300,
) -> str:
    pts = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys) if y is not None and not math.isnan(y)]
    if not pts:
        return ""
    pad_l, pad_b, pad_t, pad_r = 60, 40, 10, 20
    xs_all = [p[0] for p in pts]
    ys_all = [p[1] for p in pts]
    fx = (lambda v: math.log10(max(v, 1e-6))) if logx else (lambda v: v)
    x0, x1 = fx(min(xs_all)), fx(max(xs_all))
    y1 = max(ys_all) * 1.05 or 1.0
    x1 = x1 if x1 > x0 else x0 + 1

    def px(v: float) -> float:
        return pad_l + (fx(v) - x0) / (x1 - x0) * (width - pad_l - pad_r)

    def py(v: float) -> float:
        return height - pad_b - v / y1 * (height - pad_b - pad_t)

    out = [f'<svg width="{width}" height="{height}" role="img">']
    out.append(f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - pad_r}" y2="{height - pad_b}" stroke="#999"/>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{height - pad_b}" stroke="#999"/>')
    for i in range(5):
        yv = y1 * i / 4
        out.append(f'<text x="{pad_l - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{_f(yv)}</text>')
    ticks = np.linspace(x0, x1, 6)
    for t in ticks:
        v = 10**t if logx else t
        out.append(f'<text x="{px(v):.1f}" y="{height - pad_b + 16}" text-anchor="middle">{_f(v)}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">{html.escape(ylabel)}</text>')
    for i, (name, xs, ys) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        out.append(f'<text x="{width - pad_r - 4}" y="{pad_t + 14 + 14 * i}" text-anchor="end" fill="{color}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _distribution(rep: Report) -> str:
    total = rep.distributions.get("total")
    if total is None or len(total) == 0:
        return ""
    qs = np.linspace(0, 100, 201)
    values = total.percentiles(qs)
    cdf = _line_chart([("latency CDF", values, list(qs))], xlabel="latency (ms, log scale)", ylabel="percentile", logx=True)
    hist = ""
    if total.exact and len(total) > 1:
        v = total.values()
        lo, hi = max(v.min(), 1e-3), v.max()
        edges = np.geomspace(lo, hi if hi > lo else lo * 1.01, 41)
        counts, _ = np.histogram(np.clip(v, lo, None), bins=edges)
        mids = np.sqrt(edges[:-1] * edges[1:])
        hist = _line_chart([("requests per bin", list(mids), [float(c) for c in counts])], xlabel="latency (ms, log scale)", ylabel="requests", logx=True)
    return "<h2>Latency distribution</h2>" + hist + cdf


def _sweep(rows: list[dict[str, Any]]) -> str:
    if len(rows) < 2:
        return ""
    table = ["<table><tr><th>level</th><th>throughput req/s</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>errors</th></tr>"]
    for r in rows:
        table.append(
            f"<tr><td>{r['mode']}={r['level']:g}</td><td>{_f(r['throughput_rps'], 1)}</td><td>{_f(r['p50_ms'])}</td>"
            f"<td>{_f(r['p95_ms'])}</td><td>{_f(r['p99_ms'])}</td><td>{r['errors']}</td></tr>"
        )
    table.append("</table>")
    xs = [r["throughput_rps"] or 0.0 for r in rows]
    chart = _line_chart(
        [("p50", xs, [r["p50_ms"] for r in rows]), ("p95", xs, [r["p95_ms"] for r in rows]), ("p99", xs, [r["p99_ms"] for r in rows])],
        xlabel="throughput (requests/s)",
        ylabel="latency (ms)",
    )
    return "<h2>Throughput vs latency</h2>" + "".join(table) + chart


def _cluster(rep: Report) -> str:
    """bench --ray: each generator's row; servescope on Ray Serve: answers per replica."""
    out = []
    load = rep.load or Load()
    gens = load.generators
    if gens:
        out.append("<h2>Load generators</h2><table><tr><th>generator</th><th>node</th><th>requests</th>"
                   "<th>CPU us/request</th><th>start late ms</th></tr>")  # fmt: skip
        for g in gens:
            out.append(
                f"<tr><td>{g.generator}</td><td>{html.escape(str(g.node))}</td><td>{g.requests}</td>"
                f"<td>{_f(g.cpu_us_per_request, 1)}</td><td>{_f(g.start_late_ms)}</td></tr>"
            )
        out.append("</table>")
        for lost in load.generators_lost:
            out.append(f'<div class="finding high">lost: {html.escape(str(lost))}</div>')
    replicas = load.replicas
    if replicas:
        out.append("<h2>Replicas that answered</h2><table><tr><th>replica</th><th>answers</th></tr>")
        out += [f"<tr><td>{html.escape(str(r))}</td><td>{n}</td></tr>" for r, n in replicas.items()]
        out.append("</table>")
    return "".join(out)


def _findings(rep: Report) -> str:
    out = []
    for f in rep.findings_by_severity():
        out.append(
            f'<div class="finding {f.severity}"><b>{f.severity.upper()}</b> {html.escape(f.title)} '
            f"<span class=muted>[{html.escape(f.id)}]</span>"
            + (f"<br>evidence: {html.escape(', '.join(f'{k}={v}' for k, v in f.evidence.items()))}" if f.evidence else "")
            + (f"<pre>{html.escape(f.fix)}</pre>" if f.fix else "")
            + "</div>"
        )
    return ("<h2>Findings</h2>" + "".join(out)) if out else ""


class HTMLRenderer:
    """The report as one self-contained HTML page; ``sweep`` (rows from
    ``servescope.sweep.sweep_summary``) adds the throughput-latency curve.

        Path("report.html").write_text(HTMLRenderer(sweep=rows).render(report))
    """

    def __init__(self, *, sweep: list[dict[str, Any]] | None = None) -> None:
        self.sweep = sweep

    def __repr__(self) -> str:
        return f"HTMLRenderer(sweep={'None' if self.sweep is None else f'<{len(self.sweep)} levels>'})"

    def render(self, report: Report) -> str:
        return _page(report, self.sweep)


class ComparisonHTMLRenderer:
    """A ``Comparison`` on one page: the before/after table, both reports' breakdowns and
    distributions, and (``doctor``) the doctor's findings on the slow one.

        Path("compare.html").write_text(ComparisonHTMLRenderer().render(compare(before, after)))
    """

    def __init__(self, *, doctor: Report | None = None) -> None:
        self.doctor = doctor

    def __repr__(self) -> str:
        return f"ComparisonHTMLRenderer(doctor={'None' if self.doctor is None else '<Report>'})"

    def render(self, comparison: Comparison) -> str:
        return _comparison_page(comparison, self.doctor)


def render_html(report: Report, *, sweep: list[dict[str, Any]] | None = None) -> str:
    """``HTMLRenderer(sweep=sweep).render(report)``: the report as one HTML page."""
    return HTMLRenderer(sweep=sweep).render(report)


def render_comparison_html(before: Report, after: Report, table: Comparison, *, doctor: Report | None = None) -> str:
    """``ComparisonHTMLRenderer(doctor=doctor).render(table)``, with ``before`` and ``after`` as
    the reports shown."""
    return ComparisonHTMLRenderer(doctor=doctor).render(dataclasses.replace(table, before=before, after=after))


def _page(report: Report, sweep: list[dict[str, Any]] | None) -> str:
    title = html.escape(str(report.meta.get("title") or "servescope report"))
    env = report.environment or {}
    body = [
        f"<h1>{title}</h1>",
        _headline(report),
        "<h2>Where the time goes</h2>",
        _stacked_bar(report),
        _stage_table(report),
        _distribution(report),
        _sweep(sweep or []),
        _cluster(report),
        _findings(report),
        f"<p class=muted>{html.escape(report.created)} · Python {html.escape(str(env.get('python', '?')))}"
        f" · {html.escape(str(env.get('cpus_available', '?')))} CPUs · servescope {html.escape(str(env.get('servescope', '')))}</p>",
    ]
    return f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"


def _comparison_page(comparison: Comparison, doctor: Report | None) -> str:
    rows = ["<table><tr><th></th><th>before</th><th>after</th><th>change</th><th>95% interval</th><th>beyond noise?</th></tr>"]
    labelled = [(row.metric, row) for row in comparison.summary]
    labelled += [(stage_label(row.metric) + " (mean ms)", row) for row in comparison.stages]
    for label, row in labelled:
        sig = "-" if row.ratio is None else "can't tell" if row.significant is None else ("yes" if row.significant else "no")
        rows.append(
            f"<tr><td>{html.escape(label)}</td><td>{_f(row.before)}</td><td>{_f(row.after)}</td>"
            f"<td>{html.escape(row.words)}</td><td>{html.escape(row.interval_words)}</td><td>{sig}</td></tr>"
        )
    rows.append("</table>")
    both = []
    for rep in (comparison.before, comparison.after):
        both += [f"<h2>{html.escape(str(rep.meta.get('title', '')))}</h2>", _headline(rep), _stacked_bar(rep), _stage_table(rep), _distribution(rep)]
    diag = ""
    if doctor is not None:
        diag = "<h2>servescope doctor on the slow service</h2>" + _headline(doctor) + _stage_table(doctor) + _findings(doctor)
    title = html.escape("servescope demo: before and after" if doctor is not None else comparison.title)
    body = f"<h1>{title}</h1><h2>Before / after</h2>" + "".join(rows) + diag + "".join(both)
    return f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
