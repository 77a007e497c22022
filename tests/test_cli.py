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
        (["bench", "http://127.0.0.1:9/", "--slo", "p99<200"], "bad SLO term 'p99<200'"),
        (["bench", "http://127.0.0.1:9/", "--slo", "p99<200ms,ttft_p95>1s"], "bad SLO term 'ttft_p95>1s'"),
        (["bench", "http://127.0.0.1:9/", "--slo", "p99<1s,p99<2s"], "latency p99 is given twice"),
        (["bench", "http://127.0.0.1:9/", "--find-max"], "--find-max needs --slo"),
        (["bench", "http://127.0.0.1:9/", "--find-max", "--slo", "p99<1s", "-c", "4"], "--find-max searches open-loop rates"),
        (["bench", "http://127.0.0.1:9/", "--search-resolution", "150%"], "between 0% and 100%"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--prompt", "hi"], "--ignore-eos and --turns go with --openai"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--input-tokens", "64"], "--input-tokens, --output-tokens, --tokenizer, --ignore-eos and --turns go with --openai"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--turns", "3"], "--turns go with --openai"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--turns", "0"], "must be >= 1, got 0"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--prompt", "hi", "--think-time", "1s"], "--think-time is the pause between turns"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--prompt", "hi", "--turns", "2", "--find-max", "--slo", "p99<1s"], "--turns runs conversations at -c or -r"),
        (["bench", "http://127.0.0.1:9/", "--trace", "/nonexistent/t.jsonl"], "cannot read trace '/nonexistent/t.jsonl'"),
        (["bench", "http://127.0.0.1:9/", "--trace", "t.jsonl", "-c", "4"], "--trace takes no --concurrency"),
        (["bench", "http://127.0.0.1:9/", "--trace-speedup", "2"], "--trace-speedup goes with --trace"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--input-tokens", "0"], "at least 1"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--output-tokens", "128-64"], "N, MEAN:SD or LOW-HIGH"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--input-tokens", "64", "--prompt", "hi"], "one source of prompts"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--prompt", "hi", "--output-tokens", "8", "--max-tokens", "8"], "--max-tokens or --output-tokens, not both"),
        (["bench", "http://127.0.0.1:9/predict", "--openai", "--prompt", "hi"], "ending in /v1/chat/completions or /v1/completions"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai"], "--openai needs prompts"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--prompt", "hi"], "listed no model"),
        (["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--body", "b.json"], "not --body"),
        (["bench", "http://127.0.0.1:9/", "--file", "image"], "expected FIELD=PATH"),
        (["bench", "http://127.0.0.1:9/", "--file", "image=/nonexistent/cat.jpg"], "cannot read body file"),
        (["bench", "http://127.0.0.1:9/", "--file", "image=x.jpg", "--body", "b.json"], "--file sends one form upload"),
        (["bench", "http://127.0.0.1:9/", "--data", "/nonexistent/d.jsonl"], "cannot read data file"),
        (["bench", "http://127.0.0.1:9/", "--data", "d.jsonl", "--body", "b.json"], "give --body or --data, not both"),
        (["bench", "http://127.0.0.1:9/", "--order", "shuffled"], "invalid choice: 'shuffled'"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, message, capsys):
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_data_line_that_is_not_json_is_named_in_one_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n\n{"text": oops}\n')
    assert exit_code(["bench", "http://127.0.0.1:9/", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"data file {str(data)!r} line 3 is not JSON" in err and len(err.strip().splitlines()) == 1
    data.write_text('{"prompt": "a"}\n{"question": "b"}\n')
    assert exit_code(["bench", "http://127.0.0.1:9/v1/completions", "--openai", "--model", "m", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "line 2: expected a prompt" in err and len(err.strip().splitlines()) == 1


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


# -- one command line: the reference, the shared flags, the old spellings ---------------------

from pathlib import Path  # noqa: E402

from servescope.cli import build_parser  # noqa: E402
from servescope.cli.reference import markdown  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_reference_is_the_parser():
    assert (ROOT / "docs" / "cli.md").read_text() == markdown(), "regenerate: python -m servescope.cli.reference > docs/cli.md"


def _flags_of(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


def test_every_flag_the_readme_shows_exists():
    import re

    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"servescope (doctor|bench|serve|instrument|report|compare|demo)\b([^`\n]*)", readme)
    assert len(shown) >= 10
    for command, rest in shown:
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
            assert flag in _flags_of(command), f"README shows `servescope {command} ... {flag}`, which the parser lacks"


def test_a_shared_flag_means_the_same_in_every_command():
    for flag in ("--body", "--timeout", "--json", "--html", "--requests", "--concurrency"):
        helps = {}
        for command in ("doctor", "bench"):
            sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
            [action] = [a for a in sub.choices[command]._actions if flag in a.option_strings]
            # the same spellings and the same kind of value (bench sweeps a list of levels, the
            # doctor runs one; bench cycles several bodies, the doctor sends one)
            helps[command] = (action.option_strings, action.metavar.split("[")[0])
        assert helps["doctor"] == helps["bench"], flag


def test_old_spellings_still_work_and_name_the_new_one(tmp_path, capsys):
    body = tmp_path / "p.json"
    body.write_text("{}")
    assert exit_code(["doctor", "nope.py:predict", "--payload", str(body)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "servescope: --payload is deprecated and will be removed: use --body"
    assert "nope.py" in err[1] and "does not exist" in err[1]  # it got as far as the target: the body was read
    assert exit_code(["serve", "nope.py:M", "--ray-address", "auto"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "use --ray ADDRESS" in err[0] and err[1] == "servescope: error: --ray-address goes with --ray"


def test_json_without_a_file_goes_to_stdout_and_the_table_to_stderr(tmp_path, clock):
    from servescope import Recorder, WallClock, stage, trace

    rec = Recorder()
    with trace(clock=WallClock(clock.now), recorder=rec):
        with stage("infer"):
            clock.advance(2)
    path = rec.report(title="saved").save(tmp_path / "r.json")
    p = run("report", str(path), "--json", "-", "--html", str(tmp_path / "r.html"))
    assert json.loads(p.stdout)["latency"]["count"] == 1  # stdout is the JSON alone
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")


# -- report --diagnose: today's rules on a saved run, offline -----------------------------------


def _doctor_report(tmp_path):
    import torch

    from servescope.doctor import DoctorOptions, diagnose

    def predict(payload):  # the model built again on every request
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)).eval()
        with torch.inference_mode():
            return model(torch.ones(1, 64)).tolist()

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=5, concurrency=2, concurrent_requests=4, timeout_s=5.0))
    assert "model-load-per-request" in {f.id for f in rep.findings}
    return rep


def test_report_diagnose_runs_the_rules_again_on_the_saved_evidence(tmp_path):
    rep = _doctor_report(tmp_path)
    saved = json.loads(rep.to_json())
    ids = {f["id"] for f in saved["findings"]}
    saved["findings"] = []  # as a report saved by an older servescope, before a rule existed
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(saved))
    p = run("report", str(path), "--diagnose", "--json", "-")
    assert p.returncode == 0, p.stderr
    assert {f["id"] for f in json.loads(p.stdout)["findings"]} == ids
    gate = run("report", str(path), "--diagnose", "--fail-on", "info", "--json", str(tmp_path / "again.json"))
    assert gate.returncode == 1 and "model-load-per-request" in gate.stdout


def test_report_diagnose_says_why_it_cannot(tmp_path, clock, capsys):
    from servescope import Recorder, WallClock, stage, trace

    rec = Recorder()
    with trace(clock=WallClock(clock.now), recorder=rec):
        with stage("infer"):
            clock.advance(2)
    bench = rec.report(title="a bench run").save(tmp_path / "bench.json")
    assert main(["report", str(bench), "--diagnose"]) == 2
    err = capsys.readouterr().err
    assert "no doctor evidence" in err and "servescope doctor" in err and len(err.strip().splitlines()) == 1
    undiagnosed = json.loads(bench.read_text())
    undiagnosed["diagnosis"] = {"verdict": {"diagnosed": False, "reason": "every request failed (HTTP 404)"}}
    path = tmp_path / "undiagnosed.json"
    path.write_text(json.dumps(undiagnosed))
    assert main(["report", str(path), "--diagnose"]) == 3  # never a clean bill for a run that measured nothing
    assert main(["report", str(bench), "--fail-on", "high"]) == 2  # --fail-on judges findings: it needs --diagnose


def test_a_port_in_use_is_refused_before_anything_loads(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in (["instrument", "nowhere.py:app"], ["serve", "nowhere.py:Model"]):
            assert main([*command, "--port", str(port)]) == 2  # not "nowhere.py does not exist": the port first
            err = capsys.readouterr().err
            assert f"cannot listen on 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1
