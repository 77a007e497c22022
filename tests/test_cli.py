from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servescope.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True, timeout=120)


def test_demo_prints_a_real_breakdown_and_saves_the_report(tmp_path):
    out = tmp_path / "demo.json"
    p = run("demo", "--requests", "30", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "Baseline p50 latency:" in p.stdout
    assert "model inference" in p.stdout and "preprocessing" in p.stdout
    data = json.loads(out.read_text())
    assert data["latency"]["count"] == 31
    assert {"validate", "preprocess", "infer", "serialize"} <= set(data["stages"])
    again = run("report", str(out))
    assert again.returncode == 0 and "Baseline p50 latency:" in again.stdout


def exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # argparse exits itself
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--requests", "0"], "must be >= 1"),
        (["demo", "--requests", "many"], "expected a whole number"),
        (["report", "/nonexistent/run.json"], "cannot read report"),
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
