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
from servescope.sweep import saturation, sweep_summary

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

    code = "import sys, servescope.renderers, servescope.renderers.progress; print('servescope.loadgen' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
