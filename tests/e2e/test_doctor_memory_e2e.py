"""A forward whose feature maps glibc's malloc hands back to the kernel after every request:
the doctor tries keeping freed memory in fresh processes and names the cause with what it saved
and faulted (an endpoint whose server already keeps it is left alone: tests/test_memory_churn.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.allocator import KEEP_FREED

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent / "endpoints"


def doctor(tmp_path: Path, env: dict[str, str]) -> dict:
    (tmp_path / "p.json").write_text('{"scale": 1.0}')
    out = tmp_path / "report.json"
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(HERE / "feature_maps.py:predict"), "--body", str(tmp_path / "p.json"),
         "--requests", "6", "-c", "2", "--experiments", "10s", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert p.returncode == 0 and out.exists(), p.stdout + p.stderr
    return json.loads(out.read_text())


def test_feature_maps_handed_back_every_request_are_named_with_the_setting_measured(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in KEEP_FREED}
    rep = doctor(tmp_path, env)
    found = {f["id"]: f for f in rep["findings"]}
    w = rep["diagnosis"]["evidence"]["experiments"]["keep-freed-memory"]
    assert w["tried"], w["why_not"]
    # three 19-MB maps a request, mapped and zeroed afresh: about 14k faults (57 MB); none kept
    assert w["base_faults_per_request"] > 5_000 and w["fixed_faults_per_request"] < 0.1 * w["base_faults_per_request"], w
    assert w["extra_mb"] > 20  # (the price: the maps stay resident)
    f = found.get("memory-churn")
    assert f is not None, (rep["findings"], w)
    assert f["saving_basis"] == "measured" and f["saving_load"] == "c=1, fresh process" and f["saving_low_ms"] > 0
    assert "MALLOC_TRIM_THRESHOLD_=1073741824" in f["fix"] and "resident" in f["detail"]

