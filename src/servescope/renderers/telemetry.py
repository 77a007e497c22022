"""The server's own metrics (``bench --scrape``) and the GPUs, for the terminal and the HTML page.

    parts = terminal_parts(report)      # rich renderables, after the stage table
    page_html = html_section(report)    # an <h2> section of the page

Only the series servescope knows (``load.telemetry.KNOWN``) are shown, known servers' first;
the others are in the JSON. Every figure is in the metric's own terms: a histogram's
percentiles are estimates from its buckets, and said so.
"""

from __future__ import annotations

import html
from typing import Any

from rich.table import Table
from rich.text import Text

from ..load.telemetry import Gpu, MetricSeries, ServerMetrics
from ..report import Report

__all__ = ["MAX_ROWS_SHOWN", "figures", "html_section", "terminal_parts"]

#: Known series printed at most; the JSON has them all.
MAX_ROWS_SHOWN = 40


def _number(x: float | None) -> str:
    if x is None:
        return "-"
    if x == int(x) and abs(x) < 1e15:
        return f"{x:,.0f}"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}" if abs(x) >= 0.1 else f"{x:.3g}"


def _ms(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms" if ms >= 0.1 else f"{ms:.3f} ms"


def _bytes(x: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def value(x: float | None, unit: str | None) -> str:
    """One value in its unit's words: seconds and microseconds as ms, ratios as %, bytes in GiB."""
    if x is None:
        return "-"
    if unit == "s":
        return _ms(x * 1000)
    if unit == "us":
        return _ms(x / 1000)
    if unit == "ratio":
        return f"{x * 100:.1f}%"
    if unit == "bytes":
        return _bytes(x)
    if unit == "W":
        return f"{x:,.0f} W"
    return _number(x)


def figures(s: MetricSeries) -> str:
    """What a series did over the window, in one line."""
    unit = s.unit
    if s.type == "gauge":
        r = s.value
        if r is None:
            return "no number (NaN)"
        if r.min == r.max:
            return f"{value(r.min, unit)} throughout"
        return f"min {value(r.min, unit)} · mean {value(r.mean, unit)} · max {value(r.max, unit)}"
    if s.type == "counter":
        if s.per_s is None:
            return f"+{_number(s.increase)} (one scrape: no rate)"
        if unit == "cpu_s":
            return f"{s.per_s:.2f} cores busy (+{s.increase:,.1f} s of CPU)"
        if s.per_request is not None:
            return f"{value(s.per_request, unit)} per request (+{_number(s.increase)} {unit} in all)"
        word = f" {unit}" if unit and unit not in ("s", "us", "ratio", "bytes", "W") else ""
        return f"+{_number(s.increase)}{word} · {_number(s.per_s)}/s"
    if not s.count:
        return "no observations in the window"
    said = f"mean {value(s.mean, unit)} ({_number(s.count)} observations)"
    if s.p50 is None:
        return said
    p99 = f"≥ {value(s.p99, unit)}" if s.over_top and s.p99 is not None and s.over_top >= 0.01 * s.count else f"≈ {value(s.p99, unit)}"
    return f"p50 ≈ {value(s.p50, unit)} · p99 {p99} · {said}"


#: said under the table when a histogram is in it
ESTIMATED = "≈: estimated from the histogram's buckets (linear within the bucket, as Prometheus does); ≥: above its top bucket; means are exact"


def _labels(labels: dict[str, str], common: dict[str, str] | None = None) -> str:
    shown = {k: v for k, v in labels.items() if (common or {}).get(k) != v}
    return "{" + ",".join(f'{k}="{v}"' for k, v in shown.items()) + "}" if shown else ""


def _common(rows: list[MetricSeries]) -> dict[str, str]:
    """The labels every row has, with the same value (a model's name): said once, above the rows."""
    if len(rows) < 2:
        return {}
    common = dict(rows[0].labels)
    for s in rows[1:]:
        common = {k: v for k, v in common.items() if s.labels.get(k) == v}
    return common


def _heading(m: ServerMetrics) -> str:
    servers = "+".join(m.servers) or "no server servescope knows"
    window = f" over {m.window_s:.1f} s" if m.window_s else ""
    return f"Server's own metrics ({servers}, scraped every {m.interval_s:g} s, {m.scrapes} scrapes{window})"


def _failures(m: ServerMetrics) -> str:
    if not m.failed:
        return ""
    return f"{m.failed} of {m.failed + m.scrapes} scrapes failed (first: {m.first_error}): the figures are of the others"


def _unshown(m: ServerMetrics, shown: int) -> str:
    known = sum(1 for s in m.series if s.server is not None)
    other = len(m.series) - known + m.left_out
    said = []
    if known > shown:
        said.append(f"{known - shown} more known series")
    if other:
        said.append(f"{other} series servescope does not know" + (f" ({m.left_out} past the {len(m.series)} kept)" if m.left_out else ""))
    verb = " is" if len(said) == 1 and (known - shown or other) == 1 else " are"
    return " and ".join(said) + verb + " in the JSON (--json)" if said else ""


def _gpu_line(gpu: Gpu, target_host: str | None) -> list[str]:
    lines = []
    for d in gpu.devices:
        util = d.utilization_pct
        used = d.memory_used_bytes
        parts = [f"GPU {d.index} {d.name}"]
        if util is not None:
            parts.append(f"utilization min {util.min:.0f}% · mean {util.mean:.0f}% · max {util.max:.0f}%")
        if used is not None and used.max is not None:
            total = f" of {_bytes(d.memory_total_bytes)}" if d.memory_total_bytes else ""
            parts.append(f"memory used {_bytes(used.mean or 0)}{total} (max {_bytes(used.max)})")
        lines.append(": ".join(parts[:2]) + (" · " + " · ".join(parts[2:]) if len(parts) > 2 else ""))
    where = f"this machine's GPUs ({gpu.host}, {gpu.samples} samples)"
    if target_host and target_host not in ("127.0.0.1", "localhost", "::1", gpu.host):
        where += f"; the endpoint is on {target_host}: these are its GPUs only if it runs here"
    if gpu.failed:
        where += f"; {gpu.failed} readings failed (first: {gpu.first_error})"
    return [*lines, where]


def _target_host(report: Report) -> str | None:
    from urllib.parse import urlsplit

    target = report.meta.get("target")
    return urlsplit(target).hostname if isinstance(target, str) else None


def terminal_parts(report: Report) -> list[Any]:
    """The server's metrics table and the GPUs' lines (nothing when the run sampled neither)."""
    load = report.load
    if load is None or (load.server_metrics is None and load.gpu is None):
        return []
    parts: list[Any] = []
    m = load.server_metrics
    if m is not None:
        parts += [Text(""), Text(_heading(m), style="bold")]
        rows = [s for s in m.series if s.server is not None][:MAX_ROWS_SHOWN]
        common = _common(rows)
        if common:
            parts.append(Text(f"every series below: {_labels(common)}", style="dim"))
        if rows:
            table = Table(show_edge=False, header_style="bold", pad_edge=False)
            table.add_column("metric", overflow="fold")
            table.add_column("what")
            table.add_column("over the measured window", overflow="fold")
            for s in rows:
                table.add_row(Text(s.name + _labels(s.labels, common)), Text(s.label or ""), Text(figures(s)))
            parts.append(table)
            if any(s.p50 is not None for s in rows):
                parts.append(Text(ESTIMATED, style="dim"))
        elif m.scrapes:
            parts.append(Text("No metric servescope knows (vLLM, TGI, Triton, servescope) was seen.", style="dim"))
        if not m.scrapes and not m.failed:
            parts.append(Text("No scrape: the run ended before the measured window opened.", style="yellow"))
        elif not m.scrapes:
            parts.append(Text(f"No scrape succeeded during the measured window ({m.failed} failed; first: {m.first_error}).", style="yellow"))
        elif _failures(m):
            parts.append(Text(_failures(m), style="yellow"))
        more = _unshown(m, len(rows))
        if more:
            parts.append(Text(more, style="dim"))
    if load.gpu is not None:
        *lines, where = _gpu_line(load.gpu, _target_host(report))
        parts += [Text(""), *(Text(line) for line in lines), Text(where, style="dim")]
    elif m is not None and report.meta.get("gpu"):
        parts.append(Text(f"GPU: {report.meta['gpu']}", style="dim"))
    return parts


def html_section(report: Report) -> str:
    """The same, as an HTML section of the page."""
    load = report.load
    if load is None or (load.server_metrics is None and load.gpu is None):
        return ""
    out = []
    m = load.server_metrics
    if m is not None:
        out.append(f"<h2>{html.escape(_heading(m))}</h2>")
        rows = [s for s in m.series if s.server is not None][:MAX_ROWS_SHOWN]
        common = _common(rows)
        if common:
            out.append(f"<p class=muted>every series below: <code>{html.escape(_labels(common))}</code></p>")
        if rows:
            out.append("<table><tr><th>metric</th><th>what</th><th>over the measured window</th></tr>")
            for s in rows:
                out.append(
                    f"<tr><td><code>{html.escape(s.name + _labels(s.labels, common))}</code></td><td>{html.escape(s.label or '')}</td>"
                    f"<td>{html.escape(figures(s))}</td></tr>"
                )
            out.append("</table>")
            if any(s.p50 is not None for s in rows):
                out.append(f"<p class=muted>{html.escape(ESTIMATED)}</p>")
        for said in (_failures(m), _unshown(m, len(rows))):
            if said:
                out.append(f"<p class=muted>{html.escape(said)}</p>")
    if load.gpu is not None:
        *lines, where = _gpu_line(load.gpu, _target_host(report))
        out.append("<h2>GPUs</h2>" + "".join(f"<p>{html.escape(line)}</p>" for line in lines) + f"<p class=muted>{html.escape(where)}</p>")
    return "".join(out)
