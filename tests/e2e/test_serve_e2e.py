"""`servescope serve` as users run it: a subprocess on loopback, real HTTP, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from servescope.load.bench import BenchOptions, run_bench

from .conftest import free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BODY = json.dumps({"x": [0.1] * 256}).encode()


def start(*extra: str, target: str = "examples/mlp_serve.py:MLP"):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servescope", "serve", target, "--port", str(port), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # readiness flag, not a fixed sleep
        assert proc.poll() is None, proc.stderr.read()
        try:
            if urllib.request.urlopen(f"{url}/ready", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("not ready")


def post(url: str, timeout: float = 30):
    req = urllib.request.Request(f"{url}/predict", data=BODY, headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def server():
    proc, url = start("--max-batch-size", "16")
    yield proc, url
    proc.terminate()
    proc.communicate(timeout=30)


def test_serve_answers_and_says_what_it_picked(server):
    proc, url = server
    r = post(url)
    assert r.status == 200 and len(json.loads(r.read())["logits"]) == 10
    assert "infer;dur=" in r.headers["Server-Timing"]


def test_bench_sees_the_runtimes_stage_breakdown(server):
    _, url = server
    [rep] = run_bench(BenchOptions(url=f"{url}/predict", bodies=[BODY], content_type="application/json", concurrency=[8], duration_s=2, warmup_s=0.3))
    assert not rep.errors
    assert {"queue", "preprocess", "infer", "serialize", "network+client"} <= set(rep.stages)


def test_report_reads_what_the_running_server_served(server):
    _, url = server
    def served() -> int:
        return json.loads(urllib.request.urlopen(f"{url}/report", timeout=30).read())["latency"]["count"]

    before = served()
    for _ in range(3):
        post(url).read()
    deadline = time.monotonic() + 20
    while served() != before + 3:  # /report is built at most once a second: it catches up
        assert time.monotonic() < deadline, "GET /report never counted the 3 requests"
        time.sleep(0.1)
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "report", f"{url}/report", "--json"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["latency"]["count"] == before + 3
    assert {"queue", "infer", "serialize"} <= set(rep["stages"])


def test_memory_stays_flat_under_a_bounded_soak(server):
    proc, url = server
    opts = BenchOptions(url=f"{url}/predict", bodies=[BODY], content_type="application/json", concurrency=[8], duration_s=3, warmup_s=0.3)
    run_bench(opts)  # settle allocator and caches
    before = rss_kb(proc.pid)
    [rep] = run_bench(opts)
    run_bench(opts)
    after = rss_kb(proc.pid)
    assert rep.latency["count"] > 100
    assert after - before < 30_000, f"RSS grew {after - before} kB over two soaks"


SLOW = """
import time, torch, servescope
class Slow(servescope.Model):
    example = {"x": [0.0] * 256}
    def load(self, device):
        return torch.nn.Linear(256, 10)
    def preprocess(self, item):
        return torch.tensor(item["x"])
    def infer(self, batch):
        time.sleep(0.3)   # warm-up included: the runtime knows it is slow (no inline forwards)
        return self.model(batch)
    def postprocess(self, output):
        return {"y": output.numpy()}
"""


def test_sigterm_finishes_in_flight_requests_then_exits(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    proc, url = start(target=f"{tmp_path / 'slow.py'}:Slow")
    results = []

    def slow_client():
        try:
            results.append(post(url).status)
        except OSError as exc:
            results.append(exc)

    clients = [threading.Thread(target=slow_client) for _ in range(4)]
    for c in clients:
        c.start()
    time.sleep(0.15)  # the requests are in flight: each batch takes 0.3 s in the model
    proc.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(30)
    _, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal: -15 is its normal exit
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert results == [200, 200, 200, 200], results
    assert "ready. model on cpu" in err and "torch threads" in err


def test_a_target_that_is_not_a_model_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    p = subprocess.run([sys.executable, "-m", "servescope", "serve", f"{bad}:x"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"servescope: error: {bad}:x is int, not a servescope.Model subclass or a serve() app"]


def test_errors_stay_private_on_a_real_server_and_the_log_has_them():
    proc, url = start(target="tests/e2e/endpoints/leaky_model.py:Leaky")
    try:
        answers = {}
        for name, body in (("boom", {"x": [-1, 0, 0, 0]}), ("db", {"db": 1}), ("missing", {"y": 1})):
            req = urllib.request.Request(f"{url}/predict", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30)
            except urllib.error.HTTPError as exc:
                answers[name] = (exc.code, exc.headers.get("x-request-id"), exc.read().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    code, rid, text = answers["boom"]
    assert code == 500 and "sk-LIVE" not in text and "/home/alice" not in text and rid in text
    assert f"request {rid} failed in preprocess" in err and "sk-LIVE-123456" in err and "Traceback" in err
    code, rid, text = answers["db"]
    assert code == 422 and "hunter2" not in text and "ConnectionError" in text and "hunter2" in err
    code, _, text = answers["missing"]
    assert code == 422 and "missing field 'x'" in text


def test_a_declared_10_gb_body_is_refused_at_once_and_the_connection_closed(server):
    import socket

    _, url = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n")
        sock.sendall(b"[" * 4096)  # the start of a body the server must not wait for
        t0 = time.monotonic()
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:  # closed by the server after its answer
                break
            data += chunk
        assert time.monotonic() - t0 < 5
    assert data.startswith(b"HTTP/1.1 413") and b"connection: close" in data.lower()


def test_a_hung_model_never_holds_health_and_the_process_ends_for_its_supervisor():
    proc, url = start("--timeout", "1s", target="tests/e2e/endpoints/hanging_model.py:Hangs")
    try:
        hang = threading.Thread(
            target=lambda: _status(f"{url}/predict", json.dumps({"x": [13, 0, 0, 0]}).encode()), daemon=True
        )
        hang.start()
        time.sleep(0.3)  # the hanging batch is in the model now
        t = time.monotonic()
        assert _status(f"{url}/health") == 200
        assert time.monotonic() - t < 1.0  # the event loop is free: no model code runs on it
        code = proc.wait(timeout=30)  # the watchdog: a batch over batch_timeout_s (= --timeout) ends it
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert code == 70, err
    assert "batch_timeout_s=1" in err and "exiting with status 70" in err


def _status(url: str, data: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


# -- HTTP limits: what one client may cost the server ------------------------------------------


def _raw(port: int, data: bytes, *, wait_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; what the server answers before it closes."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except OSError:  # reset after the answer: what was read stands
            pass
        return b"".join(chunks)


@pytest.fixture(scope="module")
def limited():
    proc, url = start("--header-timeout", "1s", "--body-timeout", "1s", "--max-header-bytes", "8192", "--max-connections", "40")
    yield proc, int(url.rsplit(":", 1)[1])
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def test_a_head_over_the_limit_is_refused_before_it_is_read(limited):
    proc, port = limited
    before = rss_kb(proc.pid)
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 * 1024 * 1024) + b"\r\n\r\n"
    t = time.monotonic()
    answer = _raw(port, head)
    assert answer.startswith(b"HTTP/1.1 431") and b"request head over 8192 bytes" in answer
    assert time.monotonic() - t < 10 and rss_kb(proc.pid) - before < 32 * 1024  # 64 MB sent, not kept


def test_slow_heads_and_bodies_get_408_and_idle_connections_close(limited):
    import socket

    _, port = limited
    t = time.monotonic()
    assert _raw(port, b"POST /predict HTTP/1.1\r\nHost: x\r\n").startswith(b"HTTP/1.1 408")  # the head never ends
    slow_body = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"x\""
    answer = _raw(port, slow_body)
    assert answer.startswith(b"HTTP/1.1 408") and b"request body not received within 1 s" in answer
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        assert idle.recv(1) == b""  # closed by the server, at the head deadline
    assert time.monotonic() - t < 15


def test_connections_beyond_the_limit_get_503_and_the_rest_are_served(limited):
    import socket

    _, port = limited
    hold = [socket.create_connection(("127.0.0.1", port)) for _ in range(45)]
    try:
        req = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        assert _raw(port, req).startswith(b"HTTP/1.1 503")
    finally:
        for s in hold:
            s.close()
    time.sleep(0.5)  # the server sees the held connections close
    assert post(f"http://127.0.0.1:{port}").status == 200


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "two workers"])
def test_a_model_that_cannot_load_ends_serve_with_the_reason(workers):
    port = free_port()
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "serve", "tests/e2e/endpoints/broken_load.py:BrokenLoad", "--port", str(port), *workers],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 3, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("servescope: error: tests/e2e/endpoints/broken_load.py:BrokenLoad could not start: FileNotFoundError")
    assert "no checkpoint at /models/ckpt.pt" in last and "Traceback" in p.stderr


def _worker_of(response) -> str:
    """The worker that answered, from its Server-Timing (``replica;desc="w<pid>"``)."""
    return response.headers["server-timing"].rsplit('replica;desc="', 1)[1].split('"')[0]


def _two_workers() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servescope", "serve", "examples/mlp_serve.py:MLP", "--port", str(port), "--workers", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def test_two_workers_on_one_port_both_answer_and_report_every_request_once():
    proc, url = _two_workers()
    try:
        deadline = time.monotonic() + 120
        ready: set[str] = set()
        while len(ready) < 2 and time.monotonic() < deadline:  # each worker says ready for itself
            assert proc.poll() is None, proc.stderr.read()
            try:
                r = urllib.request.urlopen(f"{url}/predict", data=BODY, timeout=5)
                ready.add(_worker_of(r))
            except (OSError, IndexError):
                time.sleep(0.2)
        assert len(ready) == 2, "both workers answer on the one port"
        time.sleep(2.5)  # a snapshot interval (1 s) and the /report cache (1 s) later: all counted
        base = json.loads(urllib.request.urlopen(f"{url}/report", timeout=10).read())["latency"]["count"]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(url).headers["server-timing"], range(60)))
        workers = {a.rsplit('replica;desc="', 1)[1].split('"')[0] for a in answers}
        time.sleep(2.5)  # a snapshot interval (1 s) and the /report cache (1 s) later
        counts = {json.loads(urllib.request.urlopen(f"{url}/report", timeout=10).read())["latency"]["count"] for _ in range(6)}
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert len(workers) == 2, workers
    assert counts == {base + 60}, (base, counts)  # whichever worker answers /report: every request, once
    assert f'servescope_requests_total{{status="200"}} {float(base + 60)}' in metrics  # /metrics merged too
    assert 'servescope_openmp_wait_policy{policy="PASSIVE",source="servescope"} 1.0' in metrics  # (set for the workers too)


def test_a_worker_that_dies_is_replaced_and_sigterm_stops_them_all():
    import httpx

    proc, url = _two_workers()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if urllib.request.urlopen(f"{url}/ready", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(3)  # the other worker ready too
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:  # new connections reach both workers
            with httpx.Client(base_url=url, timeout=10) as c:
                seen.add(_worker_of(c.post("/predict", content=BODY)))
        assert len(seen) == 2, seen
        victim = int(min(seen)[1:])
        os.kill(victim, signal.SIGKILL)
        replaced = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (replaced - set(seen)):
            try:
                with httpx.Client(base_url=url, timeout=5) as c:  # a new connection each time
                    replaced.add(_worker_of(c.post("/predict", content=BODY)))
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert replaced - set(seen), "a new worker answers after one was killed"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0

    def alive(pid: str) -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
        except OSError:
            return False

    # every worker stopped with the supervisor (one of its processes was seen running, reparented,
    # a moment after the supervisor exited, and gone soon after: a bounded wait, not a race)
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]


def _burn(stop) -> None:
    while not stop.is_set():
        sum(range(100_000))


def test_serve_keeps_answering_with_a_cpu_hog_beside_it():
    """A neighbour that takes a core for the whole run: every request answered, none timed
    out, p99 bounded (generously: the machine may be busier still), and /metrics says the
    threads the server runs at now."""
    import multiprocessing

    stop = multiprocessing.Event()
    hog = multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
    hog.start()
    proc = None
    try:
        proc, url = start("--max-batch-size", "16")
        [rep] = run_bench(BenchOptions(url=f"{url}/predict", bodies=[BODY], content_type="application/json", concurrency=[8],
                                       duration_s=4, warmup_s=0.5, timeout_s=10))  # fmt: skip
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    finally:
        stop.set()
        hog.join(5)
        if proc is not None:
            proc.terminate()
            proc.communicate(timeout=30)
    assert not rep.errors and rep.load.requests.ok >= 50
    assert rep.latency["p99_ms"] < 2000
    assert "servescope_torch_threads{source=" in metrics and "servescope_forward_lanes{why=" in metrics
    # set before the example's file imported torch: OpenMP's idle threads sleep, not spin
    assert 'servescope_openmp_wait_policy{policy="PASSIVE",source="servescope"} 1.0' in metrics
