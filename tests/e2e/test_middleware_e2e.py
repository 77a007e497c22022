"""The one-line middleware on real servers: bench sees the breakdown, /metrics parses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servescope.load.bench import BenchOptions, run_bench

from .conftest import free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BODY = json.dumps({"x": [0.1] * 256}).encode()


@pytest.mark.parametrize("module, interface", [("middleware_fastapi", "asgi3"), ("middleware_flask", "wsgi")])
def test_bench_shows_the_breakdown_and_metrics_scrape(module, interface):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(port), "--interface", interface, "--log-level", "warning"],
        cwd=ROOT / "examples", stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # readiness: the metrics endpoint answers
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        [rep] = run_bench(BenchOptions(url=f"http://127.0.0.1:{port}/predict", bodies=[BODY], content_type="application/json", concurrency=[4], duration_s=2, warmup_s=0.3))
        assert not rep.errors
        assert {"receive", "preprocess", "infer", "network+client"} <= set(rep.stages)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        counts = {s.labels["stage"]: s.value for s in fams["servescope_stage_seconds"].samples if s.name.endswith("_count")}
        assert counts["infer"] >= rep.latency["count"]
        for _ in range(3):  # a streamed body: its chunks are made inside the request, on a real server
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/stream?rows=5", timeout=10).read()
            assert len(body.splitlines()) == 5
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        counts = {s.labels["stage"]: s.value for s in fams["servescope_stage_seconds"].samples if s.name.endswith("_count")}
        assert counts["postprocess"] == 3
    finally:
        proc.terminate()
        proc.wait(15)
        proc.stderr.close()
