"""``servescope serve FILE:Model --ray --replicas 2`` from the command line: up, answering, down on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_serve_on_ray_from_the_command_line():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servescope", "serve", "examples/mlp_serve.py:MLP", "--ray", "--replicas", "2",
         "--port", str(port), "--max-batch-size", "4"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            if "ready on Ray Serve" in line:
                break
        assert "2 replica(s) ready on Ray Serve" in line, line
        body = json.dumps({"x": [0.5] * 256}).encode()
        for _ in range(6):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body)
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200 and len(json.loads(r.read())["logits"]) == 10
                assert "upstream;" in r.headers["server-timing"]
        # the other replica's figures arrive with its next push (every second; later on a busy machine)
        count, deadline = 0, time.monotonic() + 20
        while count < 6 and time.monotonic() < deadline:
            time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/report", timeout=30) as r:
                count = json.loads(r.read())["latency"]["count"]
        assert count >= 6
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        proc.stdout.close()
    assert code == 0
