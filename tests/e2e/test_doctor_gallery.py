"""The doctor against every example endpoint: each expected finding present, no others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "examples" / "doctor"
PAYLOAD = GALLERY / "x256.json"

EXPECTED = {
    "healthy_function.py:predict": set(),
    "healthy_serve.py:app": set(),
    "load_per_request.py:predict": {"model-load-per-request"},
    "cold_start.py:predict": {"cold-start"},
    "training_mode_fastapi.py:app": {"training-mode"},
    "grad_enabled_flask.py:app": {"grad-enabled"},
    # FastAPI encodes the response on the event loop even for `def` endpoints: both are true
    "slow_serialization_fastapi.py:app": {"slow-serialization", "event-loop-blocked"},
    # the model runs on the loop, so requests queue and never share a forward
    "event_loop_blocked_fastapi.py:app": {"event-loop-blocked", "no-batching"},
    "thread_oversubscription.py:predict": {"thread-oversubscription"},
}


def doctor(target: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(GALLERY / target), "--payload", str(PAYLOAD), "--requests", "15", *extra],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_the_doctor_names_exactly_the_causes_present(target, tmp_path):
    out = tmp_path / "report.json"
    p = doctor(target, tmp_path, "--json", str(out))
    assert p.returncode == 0, p.stderr
    report = json.loads(out.read_text())
    found = {f["id"] for f in report["findings"]}
    assert found == EXPECTED[target], [(f["id"], f["severity"], f["evidence"]) for f in report["findings"]]
    for f in report["findings"]:
        assert f["fix"] and f["evidence"] and f["title"]
    assert "Baseline p50 latency" in p.stdout
    assert report["evidence"]["seconds"] < 60


def test_fail_on_turns_a_finding_into_an_exit_status(tmp_path):
    assert doctor("load_per_request.py:predict", tmp_path, "--fail-on", "high").returncode == 1
    assert doctor("healthy_function.py:predict", tmp_path, "--fail-on", "info").returncode == 0
