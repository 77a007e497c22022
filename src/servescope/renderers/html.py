"""A self-contained HTML page: headline, stage breakdown, latency distribution, sweep curve.

No scripts, no fonts, nothing fetched: inline CSS and SVG, so the file opens anywhere and can
be attached to a ticket.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any

import numpy as np

from ..compare import Comparison
from ..report import Report
from ..sections import Load
from .charts import COLORS, Axis, Bar, Series, bar_chart, histogram_bins, label_room, line_chart, log_scale
from .telemetry import html_section as telemetry_html
from .terminal import stage_label

__all__ = ["ComparisonHTMLRenderer", "HTMLRenderer", "render_comparison_html", "render_html"]

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
    from .doctor import unprobed_p50

    if unprobed := unprobed_p50(rep):
        parts.append(f"<p>{html.escape(unprobed)}</p>")
    load = rep.load or Load()
    if load.throughput_rps is not None:
        good = f" · goodput: <b>{load.slo.goodput_rps:.1f} requests/s</b> ({html.escape(load.slo.slo)})" if load.slo and load.slo.goodput_rps is not None else ""
        parts.append(f"<p>Throughput: <b>{load.throughput_rps:.1f} requests/s</b>{good}</p>")
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
        color = COLORS[i % len(COLORS)]
        out.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="28" fill="{color}"><title>{html.escape(stage_label(name))}: {_f(s["mean_ms"])} ms</title></rect>')
        if w > 60:
            out.append(f'<text x="{x + 4:.1f}" y="45">{html.escape(stage_label(name))}</text>')
            out.append(f'<text x="{x + 4:.1f}" y="59">{_f(s["mean_ms"])} ms</text>')
        x += w
    out.append("</svg>")
    return "".join(out)


def _timeline(rep: Report) -> str:
    """Latency over time (p50, p99, max per window) over the requests started per window,
    errors in red: a stall shows where it happened."""
    tl = rep.load.timeline if rep.load is not None else None
    if tl is None or not tl.windows:
        return ""
    w, wins = tl.window_s, tl.windows
    mids = [x.start_s + w / 2 for x in wins]
    x = Axis.fit([0.0, len(wins) * w], unit="s")
    y = Axis.fit([v for x_ in wins for v in (x_.p50_ms, x_.p99_ms, x_.max_ms) if v is not None], unit="ms")
    lines = [
        Series("max", mids, [x_.max_ms for x_ in wins], color=COLORS[6], dashed=True),
        Series("p99", mids, [x_.p99_ms for x_ in wins], color=COLORS[1]),
        Series("p50", mids, [x_.p50_ms for x_ in wins], color=COLORS[0]),
    ]
    room = label_room([s.name for s in lines])
    chart = line_chart(lines, x=x, y=y, xlabel="time into the measured run", ylabel="latency", title="latency over time")
    bars = [
        Bar(b.start_s, b.start_s + w, [(b.ok, "#bab0ac"), (b.errors, COLORS[3])],
            tip=f"{b.start_s:g}-{b.start_s + w:g} s: {b.ok} ok, {b.errors} failed")
        for b in wins
    ]  # fmt: skip
    y2 = Axis.fit([b.ok + b.errors for b in wins], unit="", integer=True, ticks=3)
    strip = bar_chart(bars, x=x, y=y2, xlabel="", ylabel="requests", title="requests started per window", height=150, right=room)
    failed = sum(1 for b in wins if b.errors)
    note = (
        f"Each point is a {w:g} s window: the requests that started in it (open loop: were due in it), their "
        "latency counted as in the headline. Below: requests started per window"
        + (f", failed ones in red ({failed} windows with failures)." if failed else ", none failed.")
    )
    level = next((f", {k}={rep.meta[k]:g}" for k in ("concurrency", "rate") if isinstance(rep.meta.get(k), (int, float))), "")
    return f"<h2>Latency over time{level}</h2><p class=muted>{html.escape(note)}</p>" + chart + strip


def _distribution(rep: Report) -> str:
    total = rep.distributions.get("total")
    if total is None or len(total) == 0:
        return ""
    n = len(total)
    edges, counts, log = histogram_bins(total)
    x = Axis.fit([edges[0], edges[-1]], unit="ms", log=log, zero=False)
    bars = [
        Bar(float(a), float(b), [(c, COLORS[0])], tip=f"{c} requests, {a:.4g} to {b:.4g} ms")
        for a, b, c in zip(edges[:-1], edges[1:], counts)
    ]  # fmt: skip
    scale = " (log scale)" if log else ""
    hist = bar_chart(bars, x=x, y=Axis.fit([0, max(counts)], unit="", integer=True), xlabel=f"latency{scale}",
                     ylabel="requests", title=f"latency histogram: {n} requests in {len(counts)} bins")  # fmt: skip
    qs = [float(q) for q in np.linspace(0, 100, 201)]
    values = total.percentiles(qs)
    cdf_log = log_scale(values)
    cdf = line_chart(
        [Series("all requests", values, qs)],
        x=Axis.fit(values, unit="ms", log=cdf_log, zero=False), y=Axis(0.0, 100.0, "%", False, [0.0, 25.0, 50.0, 75.0, 100.0], 25.0),
        xlabel=f"latency{' (log scale)' if cdf_log else ''}", ylabel="requests at or under", title="latency CDF",
    )  # fmt: skip
    return (
        f"<h2>Latency distribution</h2><p class=muted>{n} successful requests in {len(counts)} bins"
        f"{', logarithmic' if log else ''} (the Freedman-Diaconis width, at most the square root of the count).</p>"
        + hist + cdf
    )  # fmt: skip


def _stream(load: Load) -> str:
    """The streamed responses' figures (docs/bench.md defines each)."""
    s = load.stream
    if s is None:
        return ""
    keys = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms")
    rows = ["<table><tr><th>figure</th><th>count</th>" + "".join(f"<th>{k[:-3]} ms</th>" for k in keys) + "</tr>"]
    for label, figures in (("TTFB (time to first byte)", s.ttfb), ("TTFT (time to first token)", s.ttft),
                           ("ITL (gap between tokens)", s.itl), ("ITL, open-loop corrected", s.itl_corrected), ("ITL as observed (older report)", s.itl_uncorrected),
                           ("TPOT (time per output token)", s.tpot)):  # fmt: skip
        if figures:
            rows.append(f"<tr><td>{label}</td><td>{figures.get('count')}</td>" + "".join(f"<td>{_f(figures.get(k))}</td>" for k in keys) + "</tr>")
    rows.append("</table>")
    said = [f"{s.responses} streamed responses ({html.escape(s.kind)}), {s.chunks} tokens"]
    if s.chunks_per_s_per_request is not None:
        said.append(f"tokens/s per request (median): <b>{_f(s.chunks_per_s_per_request, 1)}</b>")
    if s.chunks_per_s is not None:
        said.append(f"tokens/s in all: <b>{_f(s.chunks_per_s, 1)}</b>")
    if s.itl_expected_ms is not None:
        said.append(f"ITL corrected for coordinated omission at the median gap, {_f(s.itl_expected_ms)} ms")
    return "<h2>Streamed responses</h2><p>" + " · ".join(said) + "</p>" + "".join(rows)


def _tokens(load: Load) -> str:
    """``--openai``: output tokens (from usage, else counted), their rate and vLLM's TPOT."""
    tk = load.tokens
    if tk is None:
        return ""
    how = [f"{n} {what}" for n, what in ((tk.from_usage, "from usage"), (tk.from_deltas, "counted from deltas"),
                                         (tk.uncounted, "not counted: no usage, not streamed")) if n]  # fmt: skip
    said = [f"Output tokens ({html.escape(tk.api)}, {html.escape(tk.model or 'model not named')}): "
            f"{tk.output_tokens:,} in {tk.responses} responses ({html.escape(', '.join(how) or 'none')})",
            f"output tokens/s: <b>{_f(tk.output_tokens_per_s, 1)}</b>"]  # fmt: skip
    if tk.tpot:
        said.append(f"TPOT (vLLM) p50 {_f(tk.tpot.get('p50_ms'))} · p99 {_f(tk.tpot.get('p99_ms'))} ms")
    if tk.input_tokens is not None:
        said.append(f"input {tk.input_tokens:,} tokens · input + output {_f(tk.total_tokens_per_s, 1)} tokens/s")
    short = tk.shortfall()
    return "<p>" + " · ".join(said) + "</p>" + (f'<div class="finding medium">{html.escape(short)}</div>' if short else "")


def _by_size(load: Load) -> str:
    """Latency (and TTFT) by input-size bucket, as the terminal prints it (``load.by_size``)."""
    buckets = load.by_size
    if not buckets:
        return ""
    ttft = any(b.ttft_p50_ms is not None for b in buckets)
    cols = ["requests", "errors", "p50 ms", "p99 ms", *(("TTFT p50 ms", "TTFT p99 ms") if ttft else ())]
    rows = [f"<table><tr><th>input size ({html.escape(buckets[0].unit)})</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for b in buckets:
        size = f"{b.smallest:,}" if b.smallest == b.largest else f"{b.smallest:,} - {b.largest:,}"
        cells = [f"{b.count:,}", f"{b.errors:,}", _f(b.p50_ms), _f(b.p99_ms), *((_f(b.ttft_p50_ms), _f(b.ttft_p99_ms)) if ttft else ())]
        rows.append(f"<tr><td>{size}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<h2>Latency by input size</h2>" + "".join(rows) + "</table>"


def _slo(load: Load) -> str:
    """--slo: each objective judged on the run, and the goodput."""
    slo = load.slo
    if slo is None:
        return ""
    ok = load.requests.ok if load.requests is not None else None
    verdict = '<b style="color:#3a7d32">met</b>' if slo.met else '<b style="color:#c0392b">missed</b>'
    rows = ["<table><tr><th>objective</th><th>the run's figure</th><th>met</th></tr>"]
    for c in slo.checks:
        value = "-" if c.value_ms is None else f"{_f(c.value_ms)} ms"
        note = f" <span class=muted>({html.escape(c.note)})</span>" if c.note else ""
        rows.append(f"<tr><td>{html.escape(c.objective)}</td><td>{value}</td><td>{'yes' if c.met else 'no'}{note}</td></tr>")
    rows.append("</table>")
    of = f" of {ok} successful" if ok is not None else ""
    return (
        f"<h2>SLO</h2><p class=big>{html.escape(slo.slo)}: {verdict} · goodput <b>{_f(slo.goodput_rps, 1)} requests/s</b>"
        f" ({slo.good}{of} requests met every objective)</p>" + "".join(rows)
    )


def _sweep(rows: list[dict[str, Any]]) -> str:
    if len(rows) < 2:
        return ""
    extra = [k for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "goodput_rps") if any(r.get(k) is not None for r in rows)]
    head = "".join(f"<th>{k.replace('_ms', ' ms').replace('_rps', ' req/s').replace('_', ' ')}</th>" for k in extra)
    table = [f"<table><tr><th>level</th><th>throughput req/s</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th>{head}<th>errors</th></tr>"]
    for r in rows:
        cells = "".join(f"<td>{_f(r.get(k), 1 if k == 'goodput_rps' else 2)}</td>" for k in extra)
        table.append(
            f"<tr><td>{r['mode']}={r['level']:g}</td><td>{_f(r['throughput_rps'], 1)}</td><td>{_f(r['p50_ms'])}</td>"
            f"<td>{_f(r['p95_ms'])}</td><td>{_f(r['p99_ms'])}</td>{cells}<td>{r['errors']}</td></tr>"
        )
    table.append("</table>")
    xs = [r["throughput_rps"] or 0.0 for r in rows]
    tips = [f"{r['mode']}={r['level']:g}: {_f(r['throughput_rps'], 1)} req/s" for r in rows]
    lines = [Series(name, xs, [r.get(f"{name}_ms") for r in rows], color=COLORS[i], markers=True, tips=tips)
             for i, name in enumerate(("p50", "p95", "p99"))]  # fmt: skip
    for i, (name, key) in enumerate((("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"))):
        if any(r.get(key) is not None for r in rows):
            lines.append(Series(name, xs, [r.get(key) for r in rows], color=COLORS[(4, 6)[i]], dashed=True, markers=True, tips=tips))
    ys = [v for s in lines for v in s.ys if v is not None]
    chart = line_chart(lines, x=Axis.fit(xs, unit="req/s"), y=Axis.fit(ys, unit="ms"), xlabel="throughput",
                       ylabel="latency", title="throughput vs latency")  # fmt: skip
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


def _live_lines(rep: Report) -> str:
    """doctor --pid: each stage's most sampled lines, as bars of their sampled ms (the flame
    graphs themselves: --flames DIR)."""
    live = rep.meta.get("live")
    top = live.get("top_lines") if isinstance(live, dict) else None
    if not top:
        return ""
    most = max((ms for lines in top.values() for _, ms in lines), default=0.0) or 1.0
    rows = ["<h2>Where the samples were, by stage</h2><table><tr><th>stage</th><th>line</th><th>sampled ms</th><th></th></tr>"]
    for stage, lines in top.items():
        for where, ms in lines:
            bar = f"<div style='background:#4a90d9;height:10px;width:{max(1, round(200 * ms / most))}px'></div>"
            rows.append(f"<tr><td>{html.escape(stage)}</td><td><code>{html.escape(str(where))}</code></td><td>{_f(ms, 1)}</td><td>{bar}</td></tr>")
    return "".join(rows) + "</table>"


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
    ``servescope.load.sweep.sweep_summary``) adds the throughput-latency curve.

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
        _stream(report.load or Load()),
        _tokens(report.load or Load()),
        _slo(report.load or Load()),
        _timeline(report),
        "<h2>Where the time goes</h2>",
        _stacked_bar(report),
        _stage_table(report),
        _by_size(report.load or Load()),
        telemetry_html(report),
        _distribution(report),
        _sweep(sweep or []),
        _cluster(report),
        _live_lines(report),
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
