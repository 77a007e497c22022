from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import servescope
from servescope import Finding, Recorder, Report, ReportError, SchemaError, WallClock, stage, trace
from servescope.doctor.evidence import Evidence
from servescope.renderers import render_terminal
from servescope.sections import (
    Diagnosis,
    FoldedStages,
    GeneratorRow,
    Load,
    Requests,
    ServerTimingCounts,
    Sweep,
    SweepRow,
    Verdict,
)


def make_report(clock, n=20, infer_ms=3.0, **meta) -> Report:
    rec = Recorder()
    for i in range(n):
        with trace(clock=WallClock(clock.now), recorder=rec):
            with stage("preprocess"):
                clock.advance(1 + i % 2)
            with stage("infer"):
                clock.advance(infer_ms)
    return rec.report(**meta)


def test_report_has_the_documented_top_level(clock):
    data = json.loads(make_report(clock).to_json())
    assert data["schema"] == "servescope.report/2"
    for key in ("environment", "latency", "stages", "findings"):
        assert key in data
    assert set(data["latency"]) >= {"count", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "first_ms"}
    assert data["stages"]["infer"]["share"] == pytest.approx(3 / 4.5, abs=1e-3)
    assert data["environment"]["python"]


def test_statistics_are_right(clock):
    r = make_report(clock)
    assert r.latency["count"] == 20
    assert r.latency["p50_ms"] == pytest.approx(4.5)
    assert r.latency["max_ms"] == pytest.approx(5.0)
    assert r.latency["first_ms"] == pytest.approx(4.0)
    assert r.stages["preprocess"]["mean_ms"] == pytest.approx(1.5)
    assert list(r.stages) == ["preprocess", "infer"]


def test_failed_requests_are_kept_apart(clock):
    rec = Recorder()
    for fail in (False, True, True):
        with pytest.raises(ValueError) if fail else _nothing():
            with trace(clock=WallClock(clock.now), recorder=rec):
                clock.advance(100 if fail else 1)
                if fail:
                    raise ValueError("bad payload")
    r = rec.report()
    assert r.errors == {"ValueError": 2}
    assert r.latency["count"] == 1 and r.latency["max_ms"] == pytest.approx(1)
    assert len(r.distributions["errors"]) == 2


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_round_trip_save_and_load(tmp_path, clock):
    r = make_report(clock, tool="test")
    r.findings.append(Finding("grad-enabled", "medium", "autograd is on", {"ratio": 1.3}, "use inference_mode"))
    r.extra["throughput_rps"] = 123.4
    path = r.save(tmp_path / "run.json")
    back = Report.load(path)
    assert back.latency == r.latency
    assert back.stages == r.stages
    assert back.findings == r.findings
    assert back.meta == {"tool": "test"}
    assert back.extra["throughput_rps"] == 123.4
    assert back.distributions["total"].percentile(50) == r.distributions["total"].percentile(50)
    assert json.loads(back.to_json()) == json.loads(r.to_json())


def test_combine_merges_distributions_not_percentiles(clock):
    a = make_report(clock, n=30, infer_ms=1.0)
    b = make_report(clock, n=10, infer_ms=20.0)
    c = Report.combine([a, b])
    allv = np.concatenate([a.distributions["total"].values(), b.distributions["total"].values()])
    assert c.latency["count"] == 40
    assert c.latency["p95_ms"] == pytest.approx(np.percentile(allv, 95))
    assert c.latency["p95_ms"] != pytest.approx((a.latency["p95_ms"] + b.latency["p95_ms"]) / 2)
    assert c.stages["infer"]["count"] == 40


def test_combine_refuses_reports_without_distributions(clock):
    r = make_report(clock)
    bare = Report.from_dict(r.to_dict(distributions=False))
    with pytest.raises(ReportError, match="averaging percentiles would be wrong"):
        Report.combine([r, bare])


def test_truncated_file_is_a_clear_error(tmp_path, clock):
    path = make_report(clock).save(tmp_path / "run.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ReportError, match="not valid JSON.*truncated"):
        Report.load(path)


def test_newer_schema_is_refused_with_the_fix(clock):
    data = make_report(clock).to_dict()
    data["schema"] = "servescope.report/3"
    with pytest.raises(SchemaError, match="newer than this servescope.*pip install -U servescope"):
        Report.from_dict(data)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("stages"), "'stages' is missing"),
        (lambda d: d.update(schema="other/1"), "not a servescope report"),
        (lambda d: d["findings"].append({"id": "x"}), r"findings\[0\]: missing severity, title"),
        (lambda d: d["distributions"].update(total={"kind": "exact", "values_ms": [-1]}), "distributions.total"),
    ],
)
def test_malformed_reports_say_where(clock, mutate, match):
    data = make_report(clock).to_dict()
    mutate(data)
    with pytest.raises(ReportError, match=match):
        Report.from_dict(data)


def test_missing_file(tmp_path):
    with pytest.raises(ReportError, match="cannot read report"):
        Report.load(tmp_path / "nope.json")


def test_terminal_view_leads_with_the_answer(clock):
    r = make_report(clock)
    r.findings.append(Finding("training-mode", "high", "model in training mode", fix="model.eval()", saving_ms=1.2))
    text = render_terminal(r)
    lines = text.splitlines()
    assert lines[0].startswith("Baseline p50 latency: 4.50 ms · p95: 5.00 ms")
    assert "Breakdown (mean per request): preprocessing 1.50 ms (33%) · model inference 3.00 ms (67%)" in text
    assert "HIGH" in text and "model.eval()" in text and "[training-mode]" in text


def test_environment_names_torch_when_imported():
    import torch  # noqa: F401

    env = servescope.report.capture_environment()
    assert env["torch"]["version"] == torch.__version__
    assert env["cpus_available"] >= 1


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["latency"].update(p50_ms="fast"), "latency.p50_ms is a string, expected a number"),
        (lambda d: d["stages"]["infer"].update(share="most"), "stages.infer.share is a string"),
        (lambda d: d["stages"].update(infer=[1, 2]), "stages.infer is an array, expected an object"),
        (lambda d: d.update(errors={"timeout": "many"}), "errors.timeout is a string"),
        (lambda d: d.update(environment="linux"), "environment is a string, expected an object"),
        (lambda d: d.update(meta=[1]), "meta is an array"),
        (lambda d: d["findings"].append({"id": "x", "severity": "low", "title": 5}), r"findings\[0\].title is a number"),
        (lambda d: d["findings"].append({"id": "x", "severity": "low", "title": "t", "evidence": []}), r"findings\[0\].evidence"),
        (lambda d: d.update(load={"throughput_rps": "fast"}), "load.throughput_rps is a string, expected a number"),
        (lambda d: d.update(load={"server_timing": {"hint": 3}}), "load.server_timing.hint is a number"),
        (lambda d: d.update(load={"generators": [{"generator": 0}]}), r"load.generators\[0\].node is null"),
        (lambda d: d.update(load={"replicas": {"a": "b"}}), "load.replicas.a is a string"),
        (lambda d: d.update(diagnosis={"verdict": {"diagnosed": False, "routes": [1]}}), r"diagnosis.verdict.routes\[0\] is a number"),
        (lambda d: d.update(folded_stage_names={"examples": "x"}), "folded_stage_names.examples is a string, expected an array"),
        (lambda d: d.update(sweep=[]), "sweep is an array, expected an object"),
        # a version-1 report: its tools' fields named as they were written
        (lambda d: d.update(schema="servescope.report/1", throughput_rps="fast"), "throughput_rps is a string, expected a number"),
        (lambda d: d.update(schema="servescope.report/1", server_timing={"hint": 3}), "server_timing.hint is a number"),
        (lambda d: d.update(schema="servescope.report/1", generators=[{"generator": 0}]), r"generators\[0\].node is null"),
        (lambda d: d.update(schema="servescope.report/1", verdict={"diagnosed": False, "routes": [1]}), r"verdict.routes\[0\] is a number"),
    ],
)
def test_fields_of_the_wrong_type_are_refused_naming_the_field(clock, mutate, where):
    data = make_report(clock).to_dict()
    mutate(data)
    with pytest.raises(ReportError, match=f"report field {where}"):
        Report.from_dict(data)


def hostile_report(clock) -> Report:
    """Names and titles from a server: terminal escapes (clear screen, window title) and markup."""
    r = make_report(clock, title="\x1b]0;pwned\x07run \x1b[2Jtitle [bold]x[/bold]")
    r.stages["[/]"] = dict(r.stages["infer"])
    r.stages["[link=http://evil.example]click[/link]"] = dict(r.stages["infer"])
    r.stages["bell\x07\x1b[31mred\x9b2J"] = dict(r.stages["infer"])
    r.findings.append(Finding("x\x1b[2J", "high", "title \x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\", fix="a = 1\x1b[2J"))
    return r


def test_the_terminal_view_prints_outside_strings_as_plain_text(clock):
    import io

    from rich.console import Console

    r = hostile_report(clock)
    for console in (None, Console(file=io.StringIO(), force_terminal=True, width=300)):
        text = render_terminal(r, console=console)  # a stage named '[/]' raised MarkupError
        shown = console.file.getvalue() if console is not None else text
        # no window title, no hyperlink (OSC 8, which [link=...] markup makes too), no clear screen
        assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert "[/]" in text and "[link=http://evil.example]click[/link]" in text  # markup shown as written
    assert "run [2Jtitle [bold]x[/bold]" in text and "bell[31mred2J" in text
    assert r.meta["title"].startswith("\x1b]0;")  # the report itself is not changed


def test_a_report_of_100000_stages_prints_the_first_ones_and_says_so(clock):
    import time as _time

    r = make_report(clock)
    r.stages = {f"s{i}": {"count": 1, "mean_ms": 1.0, "p50_ms": 1.0, "share": 0.0} for i in range(100_000)}
    t0 = _time.perf_counter()
    text = render_terminal(r)
    assert _time.perf_counter() - t0 < 20  # minutes before; well under a second here
    assert "s99 " in text and "s100 " not in text
    assert "99,900 more stages not shown" in text


DATA = Path(__file__).parent / "data"


def test_a_version_1_report_loads_into_its_sections_and_saves_as_version_2(tmp_path):
    # saved by servescope before the sections (schema 1): the tools' fields at the top level
    bench = Report.load(DATA / "report-v1-bench.json")
    assert bench.load.throughput_rps == 99.75 and bench.load.requests.measured == 41
    assert bench.load.server_timing.responses_with_header == 40 and bench.load.generator.cpu_us_per_request == 42.0
    assert bench.load.replicas == {"r0": 20, "r1": 20} and bench.load.first_error == "HTTP 503"
    assert [g.node for g in bench.load.generators] == ["host-a/1234abcd", "host-b/5678abcd"]
    assert bench.load.generators_lost == ["generator 2: ActorDiedError: node died"]
    assert bench.sweep.rows[0].level == 100 and bench.sweep.levels[0]["schema"] == "servescope.report/1"
    assert bench.unknown == {"a_key_from_a_newer_writer": {"kept": True}}
    doctor = Report.load(DATA / "report-v1-doctor.json")
    d = doctor.diagnosis
    assert d.verdict.diagnosed and d.verdict.failures == {"KeyError": 1} and d.unattributed.share == 0.35
    assert d.not_checked == {"no-batching": "batch probe skipped: no model call"} and d.endpoint_output == ["loading model...", "ready"]
    assert Evidence.from_report(doctor).cold.latency_ms == 900.0
    folded = Report.load(DATA / "report-v1-folded.json")
    assert folded.folded_stage_names.limit == 2 and folded.folded_stage_names.examples[0] == "infer_2"
    for rep in (bench, doctor, folded):
        again = Report.load(rep.save(tmp_path / "r.json"))
        assert json.loads((tmp_path / "r.json").read_text())["schema"] == "servescope.report/2"
        assert again.to_dict() == rep.to_dict()
    assert "Throughput: 99.8 requests/s" in render_terminal(bench)
    assert "counted together as '(more stages)'" in " ".join(render_terminal(folded).split())  # (wrapped)


def test_sections_keep_what_they_do_not_know(clock):
    data = make_report(clock).to_dict()
    data["load"] = {"throughput_rps": 5, "generators": [{"generator": 0, "node": "a", "gpu": "H100"}], "from_v3": [1]}
    data["diagnosis"] = {"verdict": {"diagnosed": False, "reason": "x", "severity_of_doubt": 2}}
    data["a_new_section"] = {"x": 1}
    rep = Report.from_dict(data)
    assert rep.load.throughput_rps == 5 and rep.load.generators[0].node == "a" and rep.diagnosis.verdict.reason == "x"
    back = rep.to_dict()
    assert back["load"]["from_v3"] == [1] and back["load"]["generators"][0]["gpu"] == "H100"
    assert back["diagnosis"]["verdict"]["severity_of_doubt"] == 2 and back["a_new_section"] == {"x": 1}


def test_extra_still_answers_to_the_version_1_names(clock):
    rep = make_report(clock)
    assert "throughput_rps" not in rep.extra and rep.extra.get("verdict") is None
    rep.extra["throughput_rps"] = 12.5
    rep.extra["verdict"] = {"diagnosed": False, "reason": "no answer"}
    rep.extra["custom"] = [1]
    assert rep.load.throughput_rps == 12.5 and rep.diagnosis.verdict == Verdict(diagnosed=False, reason="no answer")
    assert rep.extra["verdict"]["reason"] == "no answer" and dict(rep.extra) == {
        "throughput_rps": 12.5, "verdict": rep.diagnosis.verdict.to_dict(), "custom": [1]
    }  # fmt: skip
    del rep.extra["throughput_rps"]
    assert rep.load.throughput_rps is None and "throughput_rps" not in rep.extra
    with pytest.raises(ReportError, match="report field replicas.a is a string"):
        rep.extra["replicas"] = {"a": "b"}


def test_combine_merges_each_section_by_its_rule(clock):
    a, b = make_report(clock), make_report(clock)
    a.load = Load(
        throughput_rps=10.0, requests=Requests(measured=20, ok=19, warmup=2), uncorrected={"p50_ms": 1.0},
        server_timing=ServerTimingCounts(responses_with_header=20), replicas={"r1": 10, "r2": 10}, first_error="HTTP 503",
        generators=[GeneratorRow(generator=0, node="n1")], generators_lost=["generator 1: gone"],
    )  # fmt: skip
    b.load = Load(
        throughput_rps=20.0, requests=Requests(measured=20, ok=20, warmup=0),
        server_timing=ServerTimingCounts(responses_with_header=19, malformed=1), replicas={"r2": 5, "r3": 15},
        generators=[GeneratorRow(generator=0, node="n2")],
    )  # fmt: skip
    a.folded_stage_names = FoldedStages(limit=3, examples=["x_1", "x_2"])
    b.folded_stage_names = FoldedStages(limit=3, examples=["x_2", "y_1"])
    b.diagnosis = Diagnosis(verdict=Verdict())
    a.sweep = Sweep(rows=[SweepRow(level=1)])
    a.unknown = {"same": 1, "differs": "a"}
    b.unknown = {"same": 1, "differs": "b", "only_b": True}
    c = Report.combine([a, b])
    assert c.load.requests == Requests(measured=40, ok=39, warmup=2)  # summed
    assert c.load.server_timing == ServerTimingCounts(responses_with_header=39, malformed=1)
    assert c.load.replicas == {"r1": 10, "r2": 15, "r3": 15}
    assert [g.node for g in c.load.generators] == ["n1", "n2"] and c.load.generators_lost == ["generator 1: gone"]
    assert c.load.first_error == "HTTP 503"  # the first report's
    assert c.folded_stage_names == FoldedStages(limit=3, examples=["x_1", "x_2", "y_1"])  # joined
    assert c.unknown == {"same": 1, "only_b": True}
    # what cannot be merged is left out, and said
    assert c.load.throughput_rps is None and c.load.uncorrected is None and c.sweep is None and c.diagnosis is None
    assert set(c.meta["not_combined"]) == {"load.throughput_rps", "load.uncorrected", "sweep", "diagnosis", "differs"}
    assert "overlap" in c.meta["not_combined"]["load.throughput_rps"]
    assert "not_combined" not in Report.combine([make_report(clock), make_report(clock)]).meta


def test_a_server_timing_hint_survives_combining_only_when_no_response_had_the_header(clock):
    hint = ServerTimingCounts(hint="add the middleware")
    a, b = make_report(clock), make_report(clock)
    a.load, b.load = Load(server_timing=hint), Load(server_timing=hint)
    assert Report.combine([a, b]).load.server_timing.hint == "add the middleware"
    b.load = Load(server_timing=ServerTimingCounts(responses_with_header=3))
    assert Report.combine([a, b]).load.server_timing.hint is None
