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


def _streaming_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def predict(request):
        body = await request.body()
        if request.query_params.get("stream"):

            async def chunks():
                for i in range(3):
                    yield f"data: {i}\n\n".encode()

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse({"echo": body.decode(), "pid": os.getpid()})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


def test_once_the_helper_runs_the_requests_one_at_a_time_come_from_it_with_their_answers_and_traces(monkeypatch):
    """A client in the app's own process moves where the kernel runs the app's threads (an ONNX
    Runtime session per request ran 2-4 ms slower on the core its threads are pinned to): once
    the helper is up, every request one at a time is sent from it, as a server's clients send."""
    from servescope.doctor.endpoints import http as http_endpoint

    sent_here = []
    real = http_endpoint.send_in_turn
    monkeypatch.setattr(http_endpoint, "send_in_turn", lambda *a, **k: sent_here.append(a) or real(*a, **k))
    target = http_endpoint.ASGIEndpoint(_streaming_app(), "/predict")
    target.start(10)
    try:
        before = target.request(b'{"n": 1}', 5.0)  # (no helper yet: from this process)
        target.ready_load()
        helper = target._outside.proc.pid
        one = target.request(b'{"n": 2}', 5.0)
        block = target.one_by_one(b'{"n": 3}', 4, 5.0, 30.0)
        streamed = target.request(b"{}", 5.0, path="/predict?stream=1")
        target._outside.proc.kill()  # a helper that breaks: the next requests are sent from here
        target._outside.proc.wait()
        after = target.request(b'{"n": 4}', 5.0)
    finally:
        target.stop()
    assert len(sent_here) == 2  # the first request, and the one after the helper broke
    for o in [before, one, *block, streamed, after]:
        assert o.error is None and o.status == 200 and o.trace is not None and o.latency_ms > 0, o
    assert one.answer == b'{"echo":"{\\"n\\": 2}","pid":%d}' % os.getpid() and len(block) == 4
    assert len({id(o.trace) for o in block}) == 4  # (each its own trace, found by its id)
    assert streamed.answer == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and streamed.first_chunk_ms is not None
    assert helper != os.getpid() and target._outside.broken.startswith("BrokenPipeError")


def test_requests_one_at_a_time_stop_at_their_time_and_after_a_timeout():
    from servescope.doctor.endpoints.client import in_turn

    class Slow:
        def __init__(self, error=None):
            self.error = error

    assert len(in_turn([lambda: Slow()] * 5, 0.0)) == 1  # the first always runs, then the time is up
    assert len(in_turn([lambda: Slow()] * 5, 60.0)) == 5
    assert len(in_turn([lambda: Slow("timeout: no answer within 1 s")] * 5, 60.0)) == 1  # (the next would queue behind it)


def test_the_helper_runs_in_a_session_of_its_own_and_ends_when_the_doctor_is_killed(tmp_path):
    # where the kernel shares the CPUs between sessions (autogroup), a client in the endpoint's
    # session takes part of its share: beside a neighbour an `async def` forward's fix measured
    # 7-12 ms at c=8 against its twin's 17 under uvicorn. Out of the doctor's session, it is
    # not in the process group the command line kills at its time limit: it ends on its own
    import signal
    import subprocess
    import textwrap

    script = tmp_path / "doctor.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from servescope.doctor.endpoints.outside import OutsideLoad
        load = OutsideLoad()
        assert load.start()
        print(load.proc.pid, os.getsid(load.proc.pid), os.getsid(0), flush=True)
        time.sleep(60)
    """))
    doctor = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        helper, helper_sid, doctor_sid = map(int, doctor.stdout.readline().split())
        assert helper_sid != doctor_sid and helper_sid != os.getsid(0)
        os.killpg(doctor.pid, signal.SIGKILL)  # (as isolate.py ends a run past its time)
        doctor.wait(10)
        deadline = time.monotonic() + 10
        while _running(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(helper)
    finally:
        if doctor.poll() is None:
            doctor.kill()
        doctor.stdout.close()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one has reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
