"""The concurrent phase's and the experiments' blocks sent from a helper process
(doctor/endpoints/outside.py), against a real HTTP server on loopback."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from servescope.doctor.endpoints.outside import OutsideLoad
from servescope.environment import HELPERS, helper_cpu_seconds

_ids = itertools.count(1)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.005)
        code = 500 if body == b"fail" else 200
        self.send_response(code)
        self.send_header("Server-Timing", f'app;dur=5, servescope-doctor-request;desc="r{next(_ids)}"')
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_a_block_from_outside_gives_each_requests_latency_error_and_id_and_the_helper_ends_with_it():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predict"
    load = OutsideLoad()
    try:
        ok = load.run(url, "POST", b"{}", "application/json", concurrency=4, requests=12, timeout_s=10, max_seconds=30)
        assert ok is not None
        results, elapsed = ok
        assert len(results) == 12 and all(r.error is None and r.status == 200 for r in results), results
        assert all(5.0 <= r.latency_ms < 10_000 for r in results) and elapsed > 0  # (each sleeps 5 ms)
        # each answer's id, as its Server-Timing named it: how the phase finds its trace
        ids = [r.request_id for r in results]
        assert len(set(ids)) == 12 and all(i and i.startswith("r") for i in ids), ids
        helper = load.proc.pid
        assert helper in HELPERS  # (its CPU is the doctor's, not a neighbour's) ...
        bad, _ = load.run(url, "POST", b"fail", "application/json", concurrency=2, requests=4, timeout_s=10, max_seconds=30)
        assert len(bad) == 4 and all(r.error == "HTTP 500" for r in bad)  # the server's 500s are the block's errors
        assert load.proc.pid == helper  # (one helper for every block)
        spent = helper_cpu_seconds()
    finally:
        load.close()
        server.shutdown()
        server.server_close()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{helper}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{helper}")
    assert helper not in HELPERS and helper_cpu_seconds() >= spent  # ... and what it used stays counted once it ends


def test_no_helper_is_said_with_none_and_the_caller_measures_in_process():
    load = OutsideLoad()
    load.broken = "it could not start"
    assert load.run("http://127.0.0.1:9/x", "POST", b"", None, concurrency=1, requests=1, timeout_s=1, max_seconds=1) is None


def test_a_helper_that_cannot_start_says_why_and_the_phase_says_where_its_load_came_from():
    from servescope.doctor.endpoints.http import ASGIEndpoint

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"{}"})

    load = OutsideLoad()
    real = sys.executable
    try:
        sys.executable = "/bin/false"  # (a helper that ends at once, saying nothing)
        assert load.start() is False
    finally:
        sys.executable = real
    assert "the helper ended" in load.broken and load.proc is None
    target = ASGIEndpoint(app, "/predict")
    target.start(10)
    target._outside = load
    try:
        obs, _ = target.concurrent(b"{}", concurrency=2, requests=6, timeout_s=5.0, max_seconds=10)
    finally:
        target.stop()
    assert len(obs) == 6 and all(o.error is None and o.trace is not None for o in obs)  # measured in this process
    assert target.load_from.startswith("this process: no helper process could send it (OSError: the helper ended")
