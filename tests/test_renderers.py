"""renderers/: one protocol (options at construction, ``render(subject) -> str``), and the
module-level functions the CLI calls are the same views."""

from __future__ import annotations

import io

import orjson
import pytest
from rich.console import Console

from servescope import Recorder, Report
from servescope.renderers import HTMLRenderer, JSONRenderer, Renderer, SweepRenderer, TerminalRenderer, render_json, render_terminal
from servescope.renderers.html import render_html
from servescope.renderers.sweep import render_sweep
from servescope.load.sweep import saturation, sweep_summary

ROWS = [
    {"mode": "concurrency", "level": 1, "throughput_rps": 100.0, "p50_ms": 9.0, "p95_ms": 10.0, "p99_ms": 12.0, "errors": 0},
    {"mode": "concurrency", "level": 4, "throughput_rps": 380.0, "p50_ms": 10.0, "p95_ms": 11.0, "p99_ms": 13.0, "errors": 0},
    {"mode": "concurrency", "level": 16, "throughput_rps": 400.0, "p50_ms": 30.0, "p95_ms": 40.0, "p99_ms": 55.0, "errors": 2},
]


def report() -> Report:
    rec = Recorder()
    for i in range(50):
        rec.record_durations({"infer": 4.0 + i % 3, "serialize": 1.0}, 6.0 + i % 3)
    return rec.report(title="a run")


@pytest.mark.parametrize("renderer", [TerminalRenderer(), JSONRenderer(samples=False), HTMLRenderer(sweep=ROWS)], ids=repr)
def test_every_report_renderer_is_a_renderer_and_returns_text(renderer):
    assert isinstance(renderer, Renderer)
    out = renderer.render(report())
    assert isinstance(out, str) and "infer" in out


def test_the_functions_the_cli_calls_are_the_renderers():
    rep = report()
    console = Console(file=io.StringIO(), width=110)
    text = render_terminal(rep, console=console)
    assert text == TerminalRenderer().render(rep) == console.file.getvalue()
    assert "Baseline p50 latency" in text and "model inference" in text
    assert render_json(rep, samples=False) == JSONRenderer(samples=False).render(rep)
    assert "samples" not in orjson.loads(render_json(rep, samples=False))
    assert Report.from_json(JSONRenderer().render(rep)).latency == rep.latency
    assert render_html(rep, sweep=ROWS) == HTMLRenderer(sweep=ROWS).render(rep)
    assert "Throughput vs latency" in render_html(rep, sweep=ROWS) and "Throughput vs latency" not in render_html(rep)


def test_the_sweep_view_names_where_it_saturates():
    console = Console(file=io.StringIO(), width=110)
    render_sweep(ROWS, console=console)
    text = SweepRenderer().render(ROWS)
    assert console.file.getvalue() == text
    assert "concurrency=16" in text and "Saturates at about 380 req/s (concurrency=4)" in text
    assert "Saturates" not in SweepRenderer().render(ROWS[:2])


def test_the_sweep_rows_come_from_the_reports_in_the_library():
    reps = []
    for level, p95 in ((1, 10.0), (4, 11.0)):
        rec = Recorder()
        rec.record_durations({}, p95)
        rep = rec.report(concurrency=level)
        rep.extra["throughput_rps"] = 100.0 * level
        reps.append(rep)
    rows = sweep_summary(reps)
    assert [(r["mode"], r["level"], r["throughput_rps"], r["errors"]) for r in rows] == [("concurrency", 1, 100.0, 0), ("concurrency", 4, 400.0, 0)]
    assert saturation(rows) is None


def test_the_renderers_do_not_load_the_load_generator():
    import subprocess
    import sys

    code = "import sys, servescope.renderers, servescope.renderers.progress; print('servescope.load.loadgen' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- the HTML page's pictures (renderers/charts.py) -------------------------------------------
import math  # noqa: E402
import re  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402

import numpy as np  # noqa: E402

from servescope.load.bench import results_report  # noqa: E402
from servescope.load.loadgen import SSE, Result  # noqa: E402
from servescope.renderers.charts import Axis, end_labels, histogram_bins  # noqa: E402
from servescope.load.slo import SLO  # noqa: E402
from servescope.stats import Distribution  # noqa: E402

MS = 1_000_000
TICK = re.compile(r"^\d+(\.\d+)?( ms| s| req/s|%)?$")


def svgs(page: str) -> dict[str, ET.Element]:
    """The page's charts by their aria-label, parsed as XML (a chart that is not well-formed fails here)."""
    out = {}
    for text in re.findall(r"<svg .*?</svg>", page, re.S):
        svg = ET.fromstring(text)
        out[svg.get("aria-label")] = svg
    return out


def points(svg: ET.Element, name: str) -> list[tuple[float, float]]:
    group = next(g for g in svg.iter("g") if g.get("data-name") == name)
    return [tuple(map(float, p.split(","))) for line in group.iter("polyline") for p in line.get("points").split()]


def ticks(svg: ET.Element, kind: str) -> list[tuple[str, float]]:
    return [(t.text, float(t.get("x" if kind == "xtick" else "y"))) for t in svg.iter("text") if t.get("class") == kind]


def stalled_stream_run():
    """10 s at 100/s of streamed answers; a 1 s stall at t=4 s; every 50th request fails."""
    results = []
    for k in range(1000):
        due = k * 10 * MS
        release = 5000 * MS if 4000 * MS <= due < 5000 * MS else due
        toks = [release + (5 + 3 * j) * MS for j in range(5)]
        results.append(Result(due, due, toks[-1] + 1 * MS, 503 if k % 50 == 7 else 200, None, None, (SSE, due + 2 * MS, toks)))
    return results_report(results, measure_from_ns=0, measure_until_ns=10_000 * MS, open_loop=True,
                          slo=SLO.parse("p99<500ms,ttft_p95<100ms"), meta={"title": "stalled"})  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [[5.0], [3.0] * 40, list(np.linspace(20, 28, 7)), list(np.random.default_rng(1).lognormal(3, 0.4, 2500)),
     [2.0] * 950 + list(np.linspace(10, 1000, 50)), list(np.random.default_rng(2).exponential(30, 20_000))],
    ids=["one", "all-equal", "seven", "lognormal", "stall-tail", "exponential"],
)  # fmt: skip
def test_histogram_counts_are_whole_and_add_up_to_the_samples_in_bins_that_suit_their_number(values):
    d = Distribution()
    d.extend(values)
    edges, counts, _ = histogram_bins(d)
    assert all(type(c) is int and c >= 0 for c in counts) and sum(counts) == len(values)
    assert len(edges) == len(counts) + 1 and list(edges) == sorted(edges)
    assert edges[0] <= min(values) and edges[-1] >= max(values)
    assert 1 <= len(counts) <= min(60, math.ceil(math.sqrt(len(values))))
    if len(values) >= 2000:
        assert len(counts) >= 20  # many samples: enough bars to see a shape


def test_a_sketched_distribution_is_binned_without_losing_a_sample():
    d = Distribution(exact_limit=100)
    d.extend(np.random.default_rng(3).lognormal(2, 1, 5000))
    assert not d.exact
    _, counts, log = histogram_bins(d)
    assert sum(counts) == 5000 and log


def test_the_page_draws_the_histogram_with_the_requests_counted_once():
    rep = stalled_stream_run()
    hist = next(svg for label, svg in svgs(render_html(rep)).items() if label.startswith("latency histogram"))
    counts = [int(r.get("data-count")) for r in hist.iter("rect")]
    assert sum(counts) == rep.latency["count"] == 980
    for text, _ in ticks(hist, "ytick"):
        assert text.isdigit()  # whole requests on the count axis


def test_the_cdf_stops_at_100_percent():
    charts = svgs(render_html(stalled_stream_run()))
    cdf = charts["latency CDF"]
    labels = [t for t, _ in ticks(cdf, "ytick")]
    assert labels == ["0%", "25%", "50%", "75%", "100%"]
    top = dict(ticks(cdf, "ytick"))["100%"] - 4  # the label sits 4 px under its line
    ys = [y for _, y in points(cdf, "all requests")]
    assert min(ys) == pytest.approx(top, abs=0.05) and all(y >= top - 0.05 for y in ys)


def test_the_stall_is_a_spike_in_latency_over_time_where_it_happened():
    rep = stalled_stream_run()
    over_time = svgs(render_html(rep))["latency over time"]
    x = dict(ticks(over_time, "xtick"))
    per_s = (x["10 s"] - x["0 s"]) / 10
    peak_x, _ = min(points(over_time, "p99"), key=lambda p: p[1])  # highest on the page
    assert 4.0 <= (peak_x - x["0 s"]) / per_s <= 5.0
    strip = svgs(render_html(rep))["requests started per window"]
    failed = [int(r.get("data-count")) for r in strip.iter("rect") if r.get("fill") == "#e15759"]
    assert sum(failed) == sum(rep.errors.values()) == 20  # errors marked, each once


def test_every_axis_tick_is_a_plain_number_with_its_unit():
    page = render_html(stalled_stream_run(), sweep=ROWS)
    for label, svg in svgs(page).items():
        for kind in ("xtick", "ytick"):
            for text, _ in ticks(svg, kind):
                assert TICK.match(text), (label, text)
    over_time = svgs(page)["latency over time"]
    assert all(t.endswith(" ms") for t, _ in ticks(over_time, "ytick")) and all(t.endswith(" s") for t, _ in ticks(over_time, "xtick"))


def test_sweep_labels_are_in_the_order_of_their_lines_at_the_right_edge():
    rows = [dict(r) for r in ROWS]
    for r, ttft in zip(rows, (3.0, 12.0, 45.0)):  # TTFT p99 ends above p95 here, p50 below it
        r["ttft_p50_ms"], r["ttft_p99_ms"] = ttft / 3, ttft
    chart = svgs(render_html(report(), sweep=rows))["throughput vs latency"]
    names = [g.get("data-name") for g in chart.iter("g") if g.get("class") == "series"]
    assert set(names) == {"p50", "p95", "p99", "TTFT p50", "TTFT p99"}
    by_line = sorted(names, key=lambda n: points(chart, n)[-1][1])
    labels = {t.text: float(t.get("y")) for t in chart.iter("text") if t.get("class") == "label"}
    by_label = sorted(names, key=lambda n: labels[n])
    assert by_label == by_line == ["p99", "TTFT p99", "p95", "p50", "TTFT p50"]


def test_end_labels_keep_the_lines_order_and_do_not_overlap():
    placed = end_labels([100.0, 101.0, 99.5, 300.0, 298.0], top=10, bottom=299)
    order = sorted(range(5), key=lambda i: placed[i])
    assert order == [2, 0, 1, 4, 3]
    ys = sorted(placed)
    assert all(b - a >= 13 - 1e-9 for a, b in zip(ys, ys[1:])) and 10 <= ys[0] and ys[-1] <= 299


def test_axes_end_on_round_ticks_and_log_axes_tick_round_values():
    lin = Axis.fit([0.0, 1002.0], unit="ms")
    assert lin.ticks == [0, 200, 400, 600, 800, 1000, 1200] and [lin.label(t) for t in lin.ticks][:2] == ["0 ms", "200 ms"]
    log = Axis.fit([20.0, 1000.0], unit="ms", log=True)
    assert (log.lo, log.hi) == (20.0, 1000.0) and log.ticks == [20, 50, 100, 200, 500, 1000]
    assert Axis.fit([0, 3], unit="", integer=True).ticks == [0, 1, 2, 3]


def test_streamed_figures_and_the_slo_are_on_the_page():
    rep = stalled_stream_run()
    page = render_html(rep)
    s = rep.load.stream
    assert "Streamed responses" in page and "TTFT (time to first token)" in page and "TPOT" in page
    shown = lambda v, d=2: f"{v:.{d}f}" if v < 100 else f"{v:.0f}"  # noqa: E731 - as the page rounds
    assert f"<td>{shown(s.ttft['p50_ms'])}</td>" in page and f"<td>{shown(s.tpot['p99_ms'])}</td>" in page
    assert f"tokens/s per request (median): <b>{shown(s.chunks_per_s_per_request, 1)}</b>" in page
    assert "p99&lt;500ms,ttft_p95&lt;100ms" in page and f"goodput <b>{shown(rep.load.slo.goodput_rps, 1)} requests/s" in page
    assert "missed" in page  # the stall's TTFT p95 is over 100 ms
    plain = render_html(report())
    assert "Streamed responses" not in plain and "goodput" not in plain


def test_the_sweep_table_never_cuts_the_level_that_names_a_row():
    # a --find-max curve: rates 21.25, 21.875, 22.5 were all "rate=2…" on a 120-column screen
    rows = [
        {"mode": "rate", "level": rate, "throughput_rps": rate, "p50_ms": 1269.94, "p95_ms": 1766.64, "p99_ms": 1781.01,
         "ttft_p50_ms": 953.32, "ttft_p99_ms": 1463.9, "itl_p50_ms": 10.28, "itl_p99_ms": 11.41, "goodput_rps": 0.0,
         "slo_met": False, "errors": 1}
        for rate in (10, 21.25, 21.875, 22.5)
    ]  # fmt: skip
    text = SweepRenderer(width=120).render(rows)
    assert all(f"rate={rate:g} " in text for rate in (10, 21.25, 21.875, 22.5)), text
    assert "1,270 " in text and "1269.94" not in text  # latency as the headline prints it


def test_the_html_page_has_latency_by_input_size_and_output_tokens_as_the_terminal_does():
    from servescope.sections import Load, SizeBucket, Tokens

    rep = report()
    rep.load = Load(
        by_size=[SizeBucket(smallest=26, largest=70, count=43, p50_ms=39.55, p99_ms=85.8),
                 SizeBucket(smallest=802, largest=1692, count=40, errors=1, p50_ms=205.0, p99_ms=422.0)],
        tokens=Tokens(model="fake-1", responses=127, output_tokens=4064, from_usage=127, output_tokens_per_s=1016.0,
                      tpot={"p50_ms": 10.42, "p99_ms": 10.86}),
    )  # fmt: skip
    page = render_html(rep)
    assert "<h2>Latency by input size</h2>" in page and "<td>802 - 1,692</td><td>40</td><td>1</td><td>205</td>" in page
    assert "Output tokens (chat, fake-1): 4,064 in 127 responses (127 from usage)" in page and "<b>1016</b>" in page and "TPOT (vLLM) p50 10.42" in page
    assert "Latency by input size" not in render_html(report())


def test_a_closed_loop_max_far_above_the_p99_says_a_stall_may_be_hidden_and_how_to_see_it():
    from servescope.renderers.terminal import hidden_stall

    rec = Recorder()
    for ms in [30.0] * 199 + [1009.0]:  # one request held by a 1 s stall among 200 (c=1)
        rec.record_durations({"infer": ms}, ms)
    rep = rec.report(mode="closed loop", concurrency=1)
    text = hidden_stall(rep)
    assert "1009 ms" in text and "-r" in text and "closed loop (c=1)" in text
    assert hidden_stall(rec.report(mode="open loop", rate=20)) == ""  # an open loop counts the stall already
    steady = Recorder()
    for ms in [30.0] * 199 + [60.0]:
        steady.record_durations({"infer": ms}, ms)
    assert hidden_stall(steady.report(mode="closed loop", concurrency=1)) == ""


def test_a_busy_machine_with_spinning_openmp_threads_says_the_milliseconds_may_be_off_and_what_to_set():
    from servescope.renderers.doctor import _machine
    from servescope.sections import Diagnosis

    def said(environment: dict, kinds: tuple[str, ...] = ("torch",)) -> str:
        rep = Recorder().report(title="t")
        machine = {"busy": True, "why_busy": "other processes kept 1.0 of 2 cores busy while the doctor measured"}
        warm = {"forwards": {"kinds": kinds}}
        rep.diagnosis = Diagnosis(evidence={"machine": machine, "environment": environment, "warm": warm})
        return " ".join(t.plain for t in _machine(rep))

    spins = said({"torch_threads": 2, "omp_wait_policy": "default"})
    assert "The machine was busy" in spins and "OMP_WAIT_POLICY=PASSIVE" in spins and "several-fold" in spins
    assert "OMP_WAIT_POLICY" not in said({"torch_threads": 2, "omp_wait_policy": "OMP_WAIT_POLICY=PASSIVE"})  # theirs, set
    assert "OMP_WAIT_POLICY" not in said({"torch_threads": 1, "omp_wait_policy": "default"})  # one thread: no team to stall
    assert "OMP_WAIT_POLICY" not in said({"torch_threads": 2, "omp_wait_policy": None})  # no OpenMP runtime loaded
    assert "OMP_WAIT_POLICY" not in said({"torch_threads": 2, "omp_wait_policy": "default"}, ("scikit-learn",))  # no torch model ran


def test_a_baseline_slowed_by_the_probes_is_said_beside_what_a_server_shows():
    from servescope.sections import Diagnosis

    def headline(alone: float | None, busy: bool = False, tried: bool = True) -> str:
        rec = Recorder()
        for ms in [520.0, 522.0, 524.0]:
            rec.record_durations({"infer": ms}, ms)
        rep = rec.report(title="servescope doctor app.py:app")
        rep.diagnosis = Diagnosis(evidence={"concurrent": {"served_alone_p50_ms": alone}, "machine": {"busy": busy},
                                            "experiments": {"memoise-loaders": {"tried": tried}}})  # fmt: skip
        return render_terminal(rep, console=None, width=400) + render_html(rep).replace("&#x27;", "'")

    slowed = headline(448.0)  # (a joblib.load per request: 522 ms probed, 448 without the probes)
    assert slowed.count("Without the doctor's instruments (probes, sampler, loop watch): p50 448 ms") == 2
    assert "under them 522 ms, 17% slower" in slowed and "the fixes were tried without them" in slowed
    assert "the fixes were tried" not in headline(448.0, tried=False)  # none was: not said
    assert "Without the doctor's instruments" not in headline(500.0)  # within a tenth: nothing to say
    assert "Without the doctor's instruments" not in headline(448.0, busy=True)  # a busy machine's 5 requests: noise
    assert "Without the doctor's instruments" not in headline(None)  # not measured (a run that failed)
