from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servescope.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True, timeout=120)


def test_report_prints_a_saved_report_again(tmp_path, clock):
    from servescope import Recorder, WallClock, stage, trace

    rec = Recorder()
    for _ in range(5):
        with trace(clock=WallClock(clock.now), recorder=rec):
            with stage("infer"):
                clock.advance(2)
    path = rec.report(title="saved").save(tmp_path / "r.json")
    p = run("report", str(path))
    assert p.returncode == 0 and "Baseline p50 latency: 2.00 ms" in p.stdout and "model inference" in p.stdout
    j = run("report", str(path), "--json")
    assert json.loads(j.stdout)["latency"]["count"] == 5


def exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # argparse exits itself
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--concurrency", "0"], "must be >= 1"),
        (["demo", "--seconds", "soon"], "not a duration"),
        (["compare", "/nonexistent/a.json", "/nonexistent/b.json"], "cannot read report"),
        (["report", "/nonexistent/run.json"], "cannot read report"),
        (["report", "http://127.0.0.1:9/report"], "cannot fetch a report from http://127.0.0.1:9/report"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, message, capsys):
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_report_of_a_truncated_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "run.json"
    bad.write_text('{"schema": "servescope.report/1", "lat')
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("latency", {"count": 5, "p50_ms": "fast"}, "report field latency.p50_ms is a string, expected a number"),
        ("throughput_rps", "fast", "report field throughput_rps is a string"),
        ("stages", {"infer": {"mean_ms": [1]}}, "report field stages.infer.mean_ms is an array"),
    ],
)
def test_report_with_a_field_of_the_wrong_type_is_one_line_and_exit_2(tmp_path, capsys, field, value, message):
    data = {"schema": "servescope.report/1", "latency": {"count": 0}, "stages": {}, "findings": [], field: value}
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(data))
    assert main(["report", str(bad)]) == 2  # a traceback (TypeError, ValueError) before
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_report_fetches_over_http_only(capsys):
    assert main(["report", "ftp://127.0.0.1/report"]) == 2
    err = capsys.readouterr().err
    assert "only http:// and https:// URLs are fetched" in err and len(err.strip().splitlines()) == 1
