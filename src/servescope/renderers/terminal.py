"""The terminal view: the answer first (baseline p50/p95, the breakdown), then detail.

Every string in a report may come from outside (stage names and ``replica`` from a server's
Server-Timing, a fetched ``/report``): the view prints them as plain text, never as rich
markup, with control characters (terminal escapes: clear screen, window title, hyperlinks)
taken out, and at most ``MAX_STAGES_SHOWN`` stages and ``MAX_FINDINGS_SHOWN`` findings.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..report import Finding, Report
from ..sections import SECTIONS, Diagnosis, Load
from .base import console_text
from .telemetry import terminal_parts as telemetry_parts

__all__ = ["MAX_FINDINGS_SHOWN", "MAX_STAGES_SHOWN", "TerminalRenderer", "plain", "render_terminal", "stage_label"]

MAX_STAGES_SHOWN = 100
MAX_FINDINGS_SHOWN = 50
#: C0 and C1 controls but tab and newline, DEL, and the bidirectional overrides (text that
#: reads differently from what it is)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_BREAKS = re.compile("[\t\n]")
_MAX_CHARS = 20_000

LABELS = {
    "load": "model loading",
    "queue": "queueing",
    "receive": "receive",
    "validate": "validation",
    "preprocess": "preprocessing",
    "to_device": "host->device copy",
    "infer": "model inference",
    "to_host": "device->host copy",
    "postprocess": "postprocessing",
    "serialize": "serialization",
    "send": "send",
    "other": "outside any stage",
    "network+client": "network + client",
    "proxy+network": "proxy + network + client",
    "stream_after_head": "rest of the stream (after the head)",
}


def stage_label(name: str) -> str:
    """A stage's name in the problem's words ("infer" -> "model inference")."""
    return LABELS.get(name, name)


def plain(text: Any, *, one_line: bool = False) -> str:
    """``text`` as a string that prints as itself: no control characters (``one_line``: tabs
    and newlines become spaces), at most 20,000 characters."""
    text = _CONTROL.sub("", str(text))
    if one_line:
        text = _BREAKS.sub(" ", text)
    return text if len(text) <= _MAX_CHARS else text[:_MAX_CHARS] + "..."


def _clean(obj: Any, depth: int = 0) -> Any:
    if isinstance(obj, str):
        return plain(obj)
    if depth > 32:  # only a hostile report nests this deep
        return "..."
    if isinstance(obj, dict):
        return {plain(k, one_line=True) if isinstance(k, str) else k: _clean(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v, depth + 1) for v in obj]
    return obj


def _displayable(report: Report) -> tuple[Report, int, int]:
    """A copy of what the view shows, each string made plain; and how many stages and
    findings were left out."""
    stages = list(report.stages.items())
    findings = report.findings_by_severity()
    shown = Report(
        latency=_clean(report.latency),
        stages=_clean(dict(stages[:MAX_STAGES_SHOWN])),
        findings=[Finding(**_clean(f.to_dict())) for f in findings[:MAX_FINDINGS_SHOWN]],
        environment=_clean(report.environment),
        errors=_clean(report.errors),
        meta=_clean(report.meta),
        created=report.created,
        unknown=_clean(report.unknown),
        **{  # the sweep has its own view
            name: section.from_dict(_clean(getattr(report, name).to_dict()))
            for name, section in SECTIONS.items()
            if name != "sweep" and getattr(report, name) is not None
        },
    )
    return shown, max(len(stages) - MAX_STAGES_SHOWN, 0), max(len(findings) - MAX_FINDINGS_SHOWN, 0)


def _ms(x: Any) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def _live_line(live: dict) -> str:
    workers = live.get("workers") or []
    roots = live.get("pids") or [live.get("pid")]
    who = ("process " if len(roots) == 1 else "processes ") + ", ".join(map(str, roots))
    who += f" and {len(workers)} worker process(es) under {'it' if len(roots) == 1 else 'them'}" if workers else ""
    how = "the doctor's own requests" if live.get("mode") == "active" else "the server's own traffic"
    told = f"; {live.get('requests_told_apart', 0)} requests told apart in the samples" if live.get("mode") != "active" else ""
    cpu = live.get("cpu") or {}
    used = (f" The process used {cpu['cores_busy']:.2f} cores; its threads waited {cpu['cores_waiting']:.2f} cores' worth for a CPU."
            if cpu.get("cores_busy") is not None and cpu.get("cores_waiting") is not None else "")  # fmt: skip
    return f"Sampled {who} from outside (py-spy, {live.get('rate_hz')} Hz) for {live.get('seconds_sampled', 0):.1f} s during {how}{told}.{used}"


def _headline(report: Report) -> list[Text]:
    lat = report.latency
    lines = []
    title = report.meta.get("title")
    if title:
        lines.append(Text(str(title), style="bold"))
    live = report.meta.get("live")
    if isinstance(live, dict):  # doctor --pid: what was sampled, and how
        lines.append(Text(_live_line(live)))
    if not lat.get("count") and isinstance(live, dict) and live.get("per_request") is False:
        lines.append(Text("The server's requests came back to back: the samples cannot tell one from the next, so the stages are "
                          "shares of its time in requests, not ms per request (give --url for those).", style="yellow"))  # fmt: skip
    elif not lat.get("count"):
        lines.append(Text("No successful requests were measured.", style="bold red"))
    else:
        t = Text()
        t.append("Baseline p50 latency: ", style="bold")
        t.append(f"{_ms(lat['p50_ms'])} ms", style="bold green")
        t.append(" · p95: ", style="bold")
        t.append(f"{_ms(lat['p95_ms'])} ms", style="bold yellow")
        t.append(f" · p99: {_ms(lat['p99_ms'])} ms · max: {_ms(lat['max_ms'])} ms   ({lat['count']} requests)")
        lines.append(t)
        from .doctor import unprobed_p50

        if unprobed := unprobed_p50(report):
            lines.append(Text(unprobed, style="yellow"))
    load = report.load or Load()
    diagnosis = report.diagnosis or Diagnosis()
    if load.throughput_rps is not None:
        lines.append(Text(f"Throughput: {load.throughput_rps:.1f} requests/s"))
    if load.http is not None:
        lines.append(_http_line(load))
    if load.stream is not None:
        lines += _stream_lines(load)
    if load.tokens is not None:
        lines += _token_lines(load, report.meta.get("workload"))
    if load.slo is not None:
        lines += _slo_lines(load)
    gens, lost = load.generators, load.generators_lost
    if gens:  # bench --ray: where the load came from
        nodes = len({g.node for g in gens})
        lines.append(
            Text(
                f"Load from {report.meta.get('generators', len(gens))} generator(s) on {nodes} node(s)"
                + (f"; {len(lost)} lost: {'; '.join(lost)}" if lost else ""),
                style="yellow" if lost else "",
            )
        )
    replicas = load.replicas
    if replicas:  # servescope on Ray Serve: who answered
        lines.append(Text(f"Answered by {len(replicas)} replica(s): " + ", ".join(f"{r} {n}" for r, n in replicas.items())))
    first = lat.get("first_ms")
    if first is not None and lat.get("p50_ms"):
        ratio = first / lat["p50_ms"]
        lines.append(Text(f"First request: {_ms(first)} ms ({ratio:.1f}x the p50)", style="red" if ratio > 3 else ""))
    parts = []
    for name, s in report.stages.items():
        if s.get("mean_ms") is None:
            continue
        share = f" ({s['share'] * 100:.0f}%)" if s.get("share") is not None else ""
        parts.append(f"{stage_label(name)} {_ms(s['mean_ms'])} ms{share}")
    if parts:
        t = Text()
        t.append("Breakdown (mean per request): ", style="bold")
        t.append(" · ".join(parts))
        lines.append(t)
    gen = load.generator
    if gen is not None and gen.behind:
        lines.append(
            Text(
                f"The load generator fell behind its schedule (p99 lag {gen.schedule_lag_p99_ms} ms): "
                "its own delay is in these latencies; lower the rate or run it on another machine.",
                style="yellow",
            )
        )
    backlog = load.warmup_backlog
    if backlog is not None:
        lines.append(
            Text(
                f"{backlog.requests} requests due in the warm-up were still waiting when the measured window opened (the oldest "
                f"due {_ms(backlog.oldest_ms)} ms before it): the server is over capacity at this rate, and that queue is in these "
                "latencies. --warmup 0s measures from an empty queue; the timeline shows how it grows.",
                style="yellow",
            )
        )
    stall = hidden_stall(report)
    if stall:
        lines.append(Text(stall, style="yellow"))
    hint = load.server_timing.hint if load.server_timing is not None else None
    if hint:
        lines.append(Text(f"No per-stage breakdown: {hint}.", style="dim"))
    if diagnosis.scaling_note:
        lines.append(Text(diagnosis.scaling_note))
    for err in diagnosis.endpoint_errors:
        lines.append(Text(f"The endpoint failed: {err}", style="red"))
    folded = report.folded_stage_names
    if folded:
        examples = ", ".join(repr(n) for n in folded.examples)
        lines.append(
            Text(
                f"More than {folded.limit} stage names of your own: later ones ({examples} ...) are counted "
                f"together as {folded.into!r}. Stage names should be a fixed set: put ids elsewhere.",
                style="yellow",
            )
        )
    if report.errors:
        n = sum(report.errors.values())
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(report.errors.items(), key=lambda kv: -kv[1]))
        lines.append(Text(f"Errors: {n} requests failed ({kinds})", style="bold red"))
    return lines


def _p(summary: dict[str, Any] | None, *keys: str) -> str:
    summary = summary or {}
    if not summary.get("count"):
        return "- (none)"
    return " · ".join(f"{k} {_ms(summary.get(f'{k}_ms'))}" for k in keys) + " ms"


def _http_line(load: Load) -> Text:
    http = load.http
    assert http is not None
    setup = f"{http.connections} connection(s) opened: TCP {_p(http.connect, 'p50', 'max')}"
    if http.tls is not None:
        setup += f", TLS {_p(http.tls, 'p50', 'max')}"
    if http.dns_ms is not None:
        setup += f", name looked up once in {_ms(http.dns_ms)} ms"
    return Text(f"HTTP: time to first byte {_p(http.ttfb, 'p50', 'p99')} · transfer {_p(http.transfer, 'p50', 'p99')} · {setup}", style="dim")


def _stream_lines(load: Load) -> list[Text]:
    st = load.stream
    assert st is not None
    what = "events" if st.kind == "sse" else "chunks"
    t = Text()
    t.append("Streamed", style="bold")
    t.append(f" ({st.kind}, {st.responses} responses, {st.chunks} {what}): ")
    t.append("TTFT ", style="bold")
    t.append(_p(st.ttft, "p50", "p95", "p99"))
    t.append(" · ITL ", style="bold")
    t.append(_p(st.itl, "p50", "p95", "p99"))
    lines = [t]
    rate = f"{st.chunks_per_s_per_request:,.1f}" if st.chunks_per_s_per_request is not None else "- (read in bursts)" if st.tpot else "-"
    total = f"{st.chunks_per_s:,.0f}" if st.chunks_per_s is not None else "-"
    more = f"  TTFB {_p(st.ttfb, 'p50', 'p99')} · TPOT {_p(st.tpot, 'p50', 'p99')} · {what} per second: {rate} per request, {total} in all"
    if st.itl_corrected is not None:
        more += f" · ITL with the tokens overdue in long gaps (open-loop corrected) p99 {_ms(st.itl_corrected.get('p99_ms'))} ms"
    elif st.itl_uncorrected is not None:  # (a report from before the headline was the observed ITL)
        more += f" · ITL as observed (uncorrected) p99 {_ms(st.itl_uncorrected.get('p99_ms'))} ms"
    lines.append(Text(more, style="dim"))
    return lines


def _token_lines(load: Load, workload: Any = None) -> list[Text]:
    tk = load.tokens
    assert tk is not None
    lines = []
    if isinstance(workload, dict) and (workload.get("input_tokens") or workload.get("output_tokens")):
        said = [f"{workload[k]} tokens {w}" for k, w in (("input_tokens", "in"), ("output_tokens", "out (max_tokens)")) if workload.get(k)]
        counted = workload.get("counted_by")
        lines.append(Text(f"Workload: {', '.join(said)}, seed {workload.get('seed', 0)}" + (f"; prompts counted by {counted}" if counted else ""), style="dim"))
    how = [f"{n} {what}" for n, what in ((tk.from_usage, "from usage"), (tk.from_deltas, "counted from deltas"), (tk.uncounted, "not counted: no usage, not streamed")) if n]
    t = Text()
    t.append("Output tokens", style="bold")
    t.append(f" ({tk.api}, {plain(tk.model, one_line=True) if tk.model else 'model not named'}): ")
    rate = f"{tk.output_tokens_per_s:,.1f}" if tk.output_tokens_per_s is not None else "-"
    t.append(f"{tk.output_tokens:,} in {tk.responses} responses ({', '.join(how) or 'none'}) · {rate}/s")
    t.append(" · TPOT (vLLM) ", style="bold")
    t.append(_p(tk.tpot, "p50", "p99"))
    lines.append(t)
    if tk.input_tokens is not None:
        total = f"{tk.total_tokens_per_s:,.1f}" if tk.total_tokens_per_s is not None else "-"
        lines.append(Text(f"  input {tk.input_tokens:,} tokens (usage) · input + output {total} tokens/s", style="dim"))
    short = tk.shortfall()
    if short:
        lines.append(Text(f"  {short}", style="yellow"))
    return lines


def _turn_table(load: Load) -> list[Any]:
    ss = load.sessions
    assert ss is not None
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    unit = ss.by_turn[0].unit if ss.by_turn else "chars"
    for col in ("turn", "requests", "errors", f"prompt ({unit}, mean)", "p50 ms", "p99 ms", "TTFT p50 ms", "TTFT p99 ms"):
        table.add_column(col, justify="right")
    for t in ss.by_turn:
        table.add_row(str(t.turn), f"{t.requests:,}", f"{t.errors:,}", f"{t.prompt_mean:,.0f}", _ms(t.p50_ms), _ms(t.p99_ms), _ms(t.ttft_p50_ms), _ms(t.ttft_p99_ms))
    think = f", {_ms(ss.think_ms)} ms between an answer and the next turn" if ss.think_ms else ""
    head = (f"Conversations of {ss.turns} turns{think}: {ss.started:,} started, {ss.completed:,} ran to their last turn, {ss.cut:,} cut "
            "(by the run's end or a failed turn); each turn sends the history so far")  # fmt: skip
    return [Text(""), Text(head, style="bold"), table]


def _size_table(load: Load) -> list[Any]:
    buckets = load.by_size
    ttft = any(b.ttft_p50_ms is not None for b in buckets)
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    table.add_column(f"input size ({buckets[0].unit})", no_wrap=True)
    for col in ("requests", "errors", "p50 ms", "p99 ms", *(("TTFT p50 ms", "TTFT p99 ms") if ttft else ())):
        table.add_column(col, justify="right")
    for b in buckets:
        size = f"{b.smallest:,}" if b.smallest == b.largest else f"{b.smallest:,} - {b.largest:,}"
        ttfts = (_ms(b.ttft_p50_ms), _ms(b.ttft_p99_ms)) if ttft else ()
        table.add_row(size, f"{b.count:,}", f"{b.errors:,}", _ms(b.p50_ms), _ms(b.p99_ms), *ttfts)
    return [Text(""), Text("Latency by input size", style="bold"), table]


def _slo_lines(load: Load) -> list[Text]:
    slo = load.slo
    assert slo is not None
    t = Text()
    t.append(f"SLO {slo.slo}: ", style="bold")
    t.append("met" if slo.met else "missed", style="bold green" if slo.met else "bold red")
    if slo.goodput_rps is not None:
        t.append(f" · goodput {slo.goodput_rps:,.1f} requests/s")
        if load.throughput_rps:
            t.append(f" of {load.throughput_rps:,.1f} ({slo.goodput_rps / load.throughput_rps * 100:.0f}% met every objective)")
    lines = [t]
    for c in slo.checks:
        if not c.met:
            got = c.note or f"{_ms(c.value_ms)} ms"
            lines.append(Text(f"  missed {c.objective}: {got}", style="red"))
    return lines


def _stage_table(report: Report) -> Table:
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    table.add_column("stage", no_wrap=True)
    for col in ("mean", "p50", "p90", "p95", "p99", "max"):
        table.add_column(f"{col} ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    for name, s in report.stages.items():
        share = s.get("share")
        bar = "█" * round((share or 0) * 20)
        table.add_row(
            Text(stage_label(name)),  # a Text, never markup: the name may come from a server
            *(_ms(s.get(f"{k}_ms")) for k in ("mean", "p50", "p90", "p95", "p99", "max")),
            "-" if share is None else f"{share * 100:.1f}%",
            Text(bar, style="cyan"),
        )
    lat = report.latency
    table.add_row(
        Text("total", style="bold"),
        *(_ms(lat.get(f"{k}_ms")) for k in ("mean", "p50", "p90", "p95", "p99", "max")),
        "",
        "",
    )
    return table


def _findings(report: Report) -> list[Any]:
    if "diagnosed" in report.meta or report.findings:
        from .doctor import doctor_sections

        return doctor_sections(report)
    return []


class TerminalRenderer:
    """The terminal view: printed to ``console`` when one is given, and returned as plain
    text ``width`` columns wide.

        text = TerminalRenderer().render(report)
        TerminalRenderer(console=Console()).render(report)
    """

    def __init__(self, *, console: Console | None = None, width: int = 110) -> None:
        self.console = console
        self.width = width

    def __repr__(self) -> str:
        return f"TerminalRenderer(console={self.console!r}, width={self.width})"

    def render(self, report: Report) -> str:
        return console_text(_sections(report), console=self.console, width=self.width)


def render_terminal(report: Report, *, console: Console | None = None, width: int = 110) -> str:
    """``TerminalRenderer(console=console, width=width).render(report)``: printed to ``console``
    when one is given, returned as plain text."""
    return TerminalRenderer(console=console, width=width).render(report)


def _sections(report: Report) -> list[Any]:
    report, more_stages, more_findings = _displayable(report)
    parts: list[Any] = [*_headline(report)]
    if report.stages:
        parts += [Text(""), _stage_table(report)]
    if more_stages:
        parts.append(Text(f"{more_stages:,} more stages not shown (the JSON has them all: --json)", style="yellow"))
    if report.load is not None and report.load.by_size:
        parts += _size_table(report.load)
    if report.load is not None and report.load.sessions is not None:
        parts += _turn_table(report.load)
    parts += telemetry_parts(report)  # bench --scrape, and the GPUs
    env = report.environment or {}
    torch = env.get("torch") or {}
    where = f"Python {env.get('python', '?')}, {env.get('cpus_available', '?')} CPUs"
    if torch:
        dev = torch.get("device") or "CPU"
        where += f", torch {torch.get('version')} on {dev} ({torch.get('num_threads')} threads)"
    parts.append(Text(where, style="dim"))
    found = _findings(report)
    if found:
        parts += [Text(""), *found]
    if more_findings:
        parts.append(Text(f"{more_findings:,} more findings not shown (the JSON has them all: --json)", style="yellow"))
    return parts


#: a closed-loop max this many times its p99, and this far above it, may be a stall the loop hid
STALL_RATIO, STALL_MS = 10.0, 100.0


def hidden_stall(report: Report) -> str:
    """In closed loop a server that stalls holds its callers back, so the stall is one slow
    request among many (coordinated omission): a max far above the p99 is said, with the way
    to see what requests arriving during it would wait."""
    lat = report.latency
    p99, top = lat.get("p99_ms"), lat.get("max_ms")
    if report.meta.get("mode") != "closed loop" or not p99 or not top or top < STALL_RATIO * p99 or top - p99 < STALL_MS:
        return ""
    level = report.meta.get("concurrency")
    rps = report.load.throughput_rps if report.load is not None else None
    rate = f" -r {max(rps * 0.8, 1):.0f}" if rps else " -r RATE"
    return (
        f"The slowest request took {_ms(top)} ms, {top / p99:.0f}x the p99: in closed loop{f' (c={level:g})' if isinstance(level, (int, float)) else ''} "
        "a stall holds the callers back, so it counts once, and the percentiles hide it. An open loop at a fixed rate "
        f"counts every request due during it: servescope bench URL{rate}."
    )
