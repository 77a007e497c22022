"""bench --scrape against a real server on loopback whose /metrics (prometheus_client) counts
the requests it answers and times them: the counter's increase over the measured window is
the requests answered in it, the histogram's p50 the server's known sleep, and a scrape URL
that cannot be read stops the run before any request is sent.

The server is this module's ``app`` (uvicorn ``e2e.test_scrape_e2e:app``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import pytest

from .conftest import start_server, stop

pytestmark = pytest.mark.e2e
SLEEP_S = 0.020
CONCURRENCY = 2
BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.1, 0.25)

_metrics = None


def _registry():
    """The server's metrics, made in the server process only (the test process never serves)."""
    global _metrics
    if _metrics is None:
        import prometheus_client as prom

        registry = prom.CollectorRegistry()
        answered = prom.Counter("servescope_requests", "Requests answered", ["status"], registry=registry)
        seconds = prom.Histogram("servescope_request_seconds", "Server time per request", buckets=BUCKETS, registry=registry)
        _metrics = (prom, registry, answered.labels("200"), seconds)
    return _metrics


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    prom, registry, answered, seconds = _registry()
    if scope["path"] == "/metrics":
        status, body, ctype = 200, prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST.encode()
    elif scope["path"] == "/predict":
        t0 = time.perf_counter()
        await asyncio.sleep(SLEEP_S)
        seconds.observe(time.perf_counter() - t0)
        answered.inc()
        status, body, ctype = 200, b'{"ok": true}', b"application/json"
    else:
        status, body, ctype = 404, b"not found", b"text/plain"
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    proc, port = start_server("e2e.test_scrape_e2e:app")
    yield f"http://127.0.0.1:{port}"
    stop(proc)


def answered(base: str) -> float:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("servescope_requests_total{"))


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servescope", "bench", *args], capture_output=True, text=True, timeout=60)


def test_the_servers_counter_and_histogram_over_the_window(server, tmp_path):
    out = tmp_path / "run.json"
    p = bench(f"{server}/predict", "--scrape", f"{server}/metrics", "-c", str(CONCURRENCY), "-d", "2s", "--warmup", "0.5s", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "Server's own metrics (servescope, scraped every 1 s, 3 scrapes over 2" in p.stdout
    data = json.loads(out.read_text())
    metrics = data["load"]["server_metrics"]
    assert metrics["failed"] == 0 and metrics["scrapes"] == 3  # the window's start, 1 s in, its end
    assert 1.9 <= metrics["window_s"] <= 2.2
    [counter] = [s for s in metrics["series"] if s["name"] == "servescope_requests_total"]
    # the requests sent in the window, give or take those in flight at each of its edges
    sent = data["load"]["requests"]["measured"]
    assert sent >= 40 and abs(counter["increase"] - sent) <= 2 * CONCURRENCY + 2, (counter, sent)
    [hist] = [s for s in metrics["series"] if s["name"] == "servescope_request_seconds"]
    assert abs(hist["count"] - counter["increase"]) <= 1  # both moved by each answer
    # 20 ms sleeps fall in (0.02, 0.025] (a busy box: a few later): the p50 is read in that bucket
    assert SLEEP_S <= hist["p50"] <= 0.025 and SLEEP_S <= hist["mean"] <= 0.030
    assert hist["label"] == "server time per request" and hist["server"] == "servescope"
    assert data["load"].get("gpu") is not None or data["meta"]["gpu"].startswith("none seen")


def test_a_scrape_url_that_cannot_be_read_stops_before_any_request(server):
    before = answered(server)
    p = bench(f"{server}/predict", "--scrape", f"{server}/no-metrics-here", "-c", "2", "-d", "1s")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "HTTP 404" in p.stderr and "no request was sent" in p.stderr
    assert answered(server) == before  # not even the first request
