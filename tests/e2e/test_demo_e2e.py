"""`servescope demo` end to end, shortened: a real model, two real services, real load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_diagnoses_fixes_and_compares(tmp_path):
    out = tmp_path / "demo"
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "demo", "--seconds", "3", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Before / after" in p.stdout and "[no-batching]" in p.stdout and "[cold-start]" in p.stdout
    doctor = json.loads((out / "doctor.json").read_text())
    assert {"cold-start", "event-loop-blocked", "no-batching"} <= {f["id"] for f in doctor["findings"]}
    before = json.loads((out / "before.json").read_text())
    after = json.loads((out / "after.json").read_text())
    assert after["load"]["throughput_rps"] > before["load"]["throughput_rps"]  # batching under the same load
    assert "infer" in before["stages"] and "queue" in after["stages"]
    page = (out / "report.html").read_text()
    assert "Before / after" in page and "<svg" in page
    again = subprocess.run(
        [sys.executable, "-m", "servescope", "compare", str(out / "before.json"), str(out / "after.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0 and "beyond noise?" in again.stdout
