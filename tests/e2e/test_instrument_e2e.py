"""`servescope instrument app.py:app`: the user's app, unchanged, served with per-stage
Server-Timing on every response (a real uvicorn on loopback)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from servescope.servertiming import server_timing_durations

from .conftest import free_port, stop, wait_ready

pytestmark = pytest.mark.e2e

APP = '''
import torch
from fastapi import FastAPI

model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
app = FastAPI()


@app.post("/predict")
def predict(payload: dict):
    with torch.inference_mode():
        return {"y": model(torch.tensor([payload["x"]])).tolist()}
'''


@pytest.mark.parametrize("command", [["servescope", "instrument"], ["servescope.instrument"]], ids=["instrument", "deprecated-module"])
def test_instrument_times_the_stages_of_an_unchanged_app(tmp_path, command):
    (tmp_path / "app.py").write_text(APP)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", *command, "app.py:app", "--port", str(port)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(port, proc, timeout=60)
        r = httpx.post(f"http://127.0.0.1:{port}/predict", json={"x": [0.5] * 16}, timeout=30)
        assert r.status_code == 200 and len(r.json()["y"][0]) == 4  # the app's own answer, unchanged
        stages, total = server_timing_durations(r.headers["server-timing"])
        assert "infer" in stages and total is not None and total >= stages["infer"] > 0
    finally:
        stop(proc)
