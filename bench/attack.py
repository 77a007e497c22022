"""Issue #18's attacks, run again against the code as it is: real servers on loopback, each
attack bounded in time, one row per attack, exit status 1 if any attack fails its expectation
(the expectations are docs/reliability.md's).

    python bench/attack.py              # every attack, about 3 minutes on a 2-core VM
    python bench/attack.py --only serve # one group: serve, model, bench, report, middleware

The servers (all on 127.0.0.1, each stopped by its PID at the end, also when an attack fails):

    serve:      servescope serve examples/mlp_serve.py:MLP --header-timeout 2s --body-timeout 2s
                --max-connections 50 (the head and body size limits at their defaults)
    model:      servescope serve bench/attack.py:Hostile --timeout 1s (secrets in its errors, a
                NaN output, a leak of 10 MB a request, an input that hangs it)
    bench, report: this file's hostile_app on uvicorn (hostile Server-Timing, a dripping,
                a huge, a redirecting /report, stage names with escapes and markup)
    middleware: this file's middleware_app (its own Server-Timing, headers as a generator, its
                own /metrics) in ServescopeMiddleware with a Prometheus exporter, on uvicorn

Columns: the attack; what the issue saw before; what happens now (status codes, time to
answer, growth of the server's resident memory from /proc/PID/status, whether a witness client
sending a request every 0.1 s was still served meanwhile); the expectation; PASS or FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import http.client
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import servescope

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MLP_BODY = json.dumps({"x": [0.1] * 256}).encode()
LIMITS = ["--header-timeout", "2s", "--body-timeout", "2s", "--max-connections", "50"]
DRIP_S = 5.0  # /drip's pause between two bytes: every read is within any per-read timeout

# -- the model the "model" server runs ----------------------------------------------------------

LEAK: list[bytes] = []


class Hostile(servescope.Model):
    """x[0] < 0: an error whose text holds a secret; {"db": ...}: a validate() error with a
    password; x[0] == 5: keeps 10 MB for good; x[0] == 7: NaN out; x[0] == 13: hangs."""

    example = {"x": [0.0, 0.0, 0.0, 0.0]}

    def load(self, device):
        import torch

        torch.manual_seed(0)
        return torch.nn.Linear(4, 2)

    def validate(self, payload):
        if "db" in payload:
            raise ConnectionError("postgres://admin:hunter2@db.internal/prod refused")
        return payload["x"]

    def preprocess(self, item):
        import torch

        if item[0] < 0:
            raise RuntimeError("secret token=sk-LIVE-123456 in /home/alice/models/ckpt.pt")
        if item[0] == 5:
            LEAK.append(b"\x01" * (10 << 20))  # touched, so resident
        return torch.tensor(item, dtype=torch.float32)

    def infer(self, batch):
        if (batch == 13).any():  # as a deadlock or a stuck device would
            time.sleep(3600)
        out = self.model(batch)
        return out * float("nan") if (batch == 7).any() else out

    def postprocess(self, output):
        return {"y": output.tolist()}


# -- the hostile server (for bench and `servescope report URL`) ---------------------------------


def _report_json(stages: dict[str, Any], **fields: Any) -> bytes:
    data = {
        "schema": "servescope.report/1",
        "latency": {"count": 1, "mean_ms": 2.0, "p50_ms": 2.0, "p90_ms": 2.0, "p95_ms": 2.0, "p99_ms": 2.0, "max_ms": 2.0},
        "stages": stages,
        "findings": [],
        **fields,
    }
    return json.dumps(data).encode()


def _stage() -> dict[str, Any]:
    return {"count": 1, "mean_ms": 1.0, "p50_ms": 1.0, "share": 0.1}


ESCAPE_NAMES = [
    "\x1b[2J\x1b[Hclear",  # clear screen, cursor home
    "\x1b]0;pwned\x07title",  # window title
    "\x1b]8;;https://evil.example\x1b\\osc8\x1b]8;;\x1b\\",  # a terminal hyperlink
    "\x9b31mc1",  # C1 CSI
    "\u202eevil",  # right-to-left override
    "[link=https://evil.example]click[/link]",
    "[/]",
    "[bold red]loud[/]",
]


async def hostile_app(scope, receive, send):
    """``/huge-dur`` Server-Timing durations of 1e308; ``/big-timing`` 1 MB of Server-Timing a
    response; ``/many-timing`` 20,000 Server-Timing lines; ``/drip`` a byte every DRIP_S s;
    ``/big`` 1000 MB without a length; ``/to-ftp`` a redirect to ftp://; ``/stages`` a report
    of 100,000 stages; ``/escapes`` stage names and a finding with escapes and markup;
    ``/wrong-type`` a report whose p50 is a string."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    path = scope["path"]
    headers = [(b"content-type", b"application/json")]
    body = b'{"ok": true}'
    if path == "/huge-dur":
        headers.append((b"server-timing", b"infer;dur=1e308, infer;dur=1e308, total;dur=1e308"))
    elif path == "/big-timing":
        headers.append((b"server-timing", b", ".join([b"a;dur=0.001"] * 90_000)))  # ~1 MB
    elif path == "/many-timing":
        headers += [(b"server-timing", b"a;dur=0.001")] * 20_000
    elif path == "/stages":
        body = _report_json({f"s{i}": _stage() for i in range(100_000)})
    elif path == "/escapes":
        finding = {"id": "\x1b[2Jx", "severity": "medium", "title": "[link=https://evil.example]t[/link]\x1b]0;t\x07", "fix": "[/]"}
        body = _report_json({n: _stage() for n in ESCAPE_NAMES}, findings=[finding])
    elif path == "/wrong-type":
        body = _report_json({"infer": _stage()})
        body = body.replace(b'"p50_ms": 2.0', b'"p50_ms": "fast"', 1)
    elif path == "/big":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = b" " * (1 << 20)
        for _ in range(1000):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    elif path == "/drip":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while True:  # until the client leaves (uvicorn then fails the send)
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await asyncio.sleep(DRIP_S)
    elif path == "/to-ftp":
        await send({"type": "http.response.start", "status": 302, "headers": [(b"location", b"ftp://127.0.0.1/report")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- the app behind the middleware --------------------------------------------------------------

OWN_TIMING = b'cache;desc="hit", db;dur=2.5;desc="primary"'
HUGE_TIMING = b"db;dur=1e308, db;dur=1e308"


async def _inner_app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/own-timing":
        headers: Any = [(b"content-type", b"text/plain"), (b"server-timing", OWN_TIMING)]
    elif path == "/huge-dur":
        headers = [(b"content-type", b"text/plain"), (b"server-timing", HUGE_TIMING)]
    elif path == "/generator":
        headers = (h for h in [(b"content-type", b"text/plain"), (b"x-app", b"kept")])
    elif path == "/metrics":
        headers = [(b"content-type", b"text/plain")]
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"app body " + path.encode()})


def middleware_app():
    from servescope.exporters import PrometheusExporter
    from servescope.middleware import ServescopeMiddleware

    return ServescopeMiddleware(_inner_app, exporters=[PrometheusExporter()])


# -- tools: servers, raw sockets, a witness client ----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Server:
    """A subprocess on loopback, its log in a file, stopped by its PID."""

    def __init__(self, name: str, argv: list[str], ready_path: str) -> None:
        self.name = name
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"attack-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://{HOST}:{self.port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: {self.text()[-2000:]}")
            if request("GET", self.url + ready_path, timeout=1)[0] == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} not ready within 90 s")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def serve_cmd(target: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "servescope", "serve", target, "--host", HOST, *extra]


def uvicorn_cmd(role: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--serve", role]


def request(method: str, url: str, body: bytes | None = None, *, timeout: float = 10) -> tuple[int, dict[str, list[str]], bytes, float]:
    """(status, headers by lower-case name, body, seconds) on a fresh connection; status 0 on
    a connection error or timeout."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.partition(":")
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, "/" + path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        data = resp.read()
        headers: dict[str, list[str]] = {}
        for k, v in resp.getheaders():
            headers.setdefault(k.lower(), []).append(v)
        return resp.status, headers, data, time.monotonic() - t0
    except (OSError, http.client.HTTPException):
        return 0, {}, b"", time.monotonic() - t0
    finally:
        conn.close()


def raw(port: int, data: bytes, *, wait_s: float = 15.0) -> tuple[bytes, float, float]:
    """Send ``data`` on a fresh connection; (what the server answers before it closes, seconds
    to the first byte of the answer, seconds to the close)."""
    t0 = time.monotonic()
    first = float("nan")
    with socket.create_connection((HOST, port), timeout=wait_s) as s:
        with contextlib.suppress(OSError):  # the server may close while we still send
            s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                if not chunks:
                    first = time.monotonic() - t0
                chunks.append(chunk)
        except OSError:  # reset after the answer: what was read stands
            pass
    return b"".join(chunks), first, time.monotonic() - t0


def status_of(answer: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    return int(m.group(1)) if m else 0


class Witness:
    """Another client: POST (or GET) every 0.1 s on a fresh connection while an attack runs
    (and at least ``min_s``); it is served if every answer is a 200 within a second."""

    def __init__(self, url: str, body: bytes | None = None, *, min_s: float = 2.0) -> None:
        self.url, self.body, self.min_s = url, body, min_s
        self.results: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, _, _, seconds = request("POST" if self.body else "GET", self.url, self.body, timeout=5)
            self.results.append((status, seconds))
            self._stop.wait(0.1)

    def __enter__(self) -> Witness:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.min_s - (time.monotonic() - self._t0)))  # past a lingering close too
        self._stop.set()
        self._thread.join(10)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(s == 200 and t < 1.0 for s, t in self.results)

    def __str__(self) -> str:
        served = sum(s == 200 for s, _ in self.results)
        slowest = max((t for _, t in self.results), default=float("nan"))
        return f"others {served}/{len(self.results)} served, slowest {slowest * 1000:.0f} ms"


def cli(args: list[str], *, timeout: float) -> tuple[int, str, str, float, float]:
    """Run ``servescope ARGS``: (exit status, stdout, stderr, seconds, peak RSS in MB)."""
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "servescope", *args], cwd=ROOT, stdout=out, stderr=err, env=env)
    peak = 0.0
    try:
        while proc.poll() is None:
            peak = max(peak, rss_mb(proc.pid, "VmHWM") or 0.0)
            if time.monotonic() - t0 > timeout:
                proc.kill()
                proc.wait(5)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    seconds = time.monotonic() - t0
    out.seek(0)
    err.seek(0)
    return proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seconds, peak


def find_key(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        if key in data:
            return data[key]
        data = list(data.values())
    if isinstance(data, list):
        for item in data:
            found = find_key(item, key)
            if found is not None:
                return found
    return None


# -- the attacks --------------------------------------------------------------------------------


@dataclass
class Attack:
    group: str
    name: str
    before: str
    expected: str
    run: Callable[[dict[str, Server]], tuple[str, bool]]
    bound_s: float


ATTACKS: list[Attack] = []


def attack(group: str, name: str, *, before: str, expected: str, bound_s: float):
    def register(fn: Callable[[dict[str, Server]], tuple[str, bool]]):
        ATTACKS.append(Attack(group, name, before, expected, fn, bound_s))
        return fn

    return register


def p99_ms(url: str, seconds: float) -> tuple[float, int]:
    from servescope.load.bench import BenchOptions, run_bench

    [rep] = run_bench(BenchOptions(url=url, bodies=[MLP_BODY], content_type="application/json", concurrency=[2], duration_s=seconds, warmup_s=0.5))
    return rep.latency["p99_ms"], rep.latency["count"]


@attack(
    "serve",
    "/report scraped 20/s while /predict is measured (c=2, 4 s each)",
    before="p99 13.5 -> 170 ms at 18 scrapes/s",
    expected="p99 while scraped <= 2x p99 before + 5 ms",
    bound_s=40,
)
def report_scrape(s):
    srv = s["serve"]
    before, n0 = p99_ms(srv.url + "/predict", 4)
    stop = threading.Event()
    scrapes: list[int] = []

    def scrape() -> None:
        while not stop.is_set():
            scrapes.append(request("GET", srv.url + "/report", timeout=10)[0])
            stop.wait(0.05)

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    try:
        during, n1 = p99_ms(srv.url + "/predict", 4)
    finally:
        stop.set()
        t.join(15)
    ok = during <= 2 * before + 5 and scrapes and all(c == 200 for c in scrapes)
    return f"p99 {before:.1f} -> {during:.1f} ms ({n0} / {n1} requests; {len(scrapes)} scrapes, all 200: {all(c == 200 for c in scrapes)})", ok


@attack(
    "serve",
    "two 64 MB request headers at once",
    before="1 MB and 64 MB accepted; two 128 MB: 6 of 7 others failed for 30 s, RSS 545 MB",
    expected="431 within 10 s, RSS +<32 MB, others served",
    bound_s=40,
)
def huge_header(s):
    srv = s["serve"]
    rss0 = rss_mb(srv.pid)
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 20) + b"\r\n\r\n"
    answers: list[tuple[bytes, float, float]] = []
    peak = [rss0]

    def watch(stop: threading.Event) -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(srv.pid))
            stop.wait(0.02)

    stop = threading.Event()
    w = threading.Thread(target=watch, args=(stop,), daemon=True)
    w.start()
    with Witness(srv.url + "/predict", MLP_BODY) as other:
        senders = [threading.Thread(target=lambda: answers.append(raw(srv.port, head, wait_s=20))) for _ in range(2)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
    stop.set()
    w.join(5)
    codes = [status_of(a) for a, _, _ in answers]
    firsts = [f for _, f, _ in answers]
    grew = peak[0] - rss0
    ok = codes == [431, 431] and max(firsts) < 10 and grew < 32 and other.ok
    return f"{codes}, answered in {max(firsts):.2f} s; RSS {grew:+.0f} MB (peak); {other}", ok


@attack(
    "serve",
    "60 idle connections (--max-connections 50)",
    before="1,100 idle connections (ulimit -n 1024): every other client failed for 17 s",
    expected="503 at once beyond the limit; idle ones closed at the 2 s head deadline; then served",
    bound_s=30,
)
def idle_connections(s):
    srv = s["serve"]
    held = [socket.create_connection((HOST, srv.port), timeout=10) for _ in range(60)]
    try:
        time.sleep(0.3)  # the server has accepted them
        status, _, _, seconds = request("POST", srv.url + "/predict", MLP_BODY, timeout=5)
        t0 = time.monotonic()
        closed = 0
        for sock in held:
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except OSError:
                closed += 1
        closed_after = time.monotonic() - t0 + 0.3 + seconds
    finally:
        for sock in held:
            sock.close()
    t1 = time.monotonic()
    after = 0
    while time.monotonic() - t1 < 5 and after != 200:
        after = request("POST", srv.url + "/predict", MLP_BODY, timeout=5)[0]
    ok = status == 503 and seconds < 1 and closed == 60 and closed_after < 2 + 1.5 and after == 200
    return f"{status} in {seconds * 1000:.0f} ms; {closed}/60 idle closed by the server after {closed_after:.1f} s; then {after}", ok


def _dribble(port: int, first: bytes, byte: bytes, every_s: float, limit_s: float) -> tuple[int, float]:
    """Send ``first``, then ``byte`` every ``every_s`` until the server answers: (status, s)."""
    t0 = time.monotonic()
    with socket.create_connection((HOST, port), timeout=every_s) as sock:
        sock.sendall(first)
        answer = b""
        while time.monotonic() - t0 < limit_s:
            try:
                answer = sock.recv(4096)
                break
            except socket.timeout:
                with contextlib.suppress(OSError):
                    sock.sendall(byte)
            except OSError:
                break
    return status_of(answer), time.monotonic() - t0


def _slow(s, first: bytes, byte: bytes) -> tuple[str, bool]:
    srv = s["serve"]
    results: list[tuple[int, float]] = []
    with Witness(srv.url + "/predict", MLP_BODY) as other:
        threads = [threading.Thread(target=lambda: results.append(_dribble(srv.port, first, byte, 0.5, 15))) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    codes = sorted({c for c, _ in results})
    slowest = max(t for _, t in results)
    ok = codes == [408] and len(results) == 20 and slowest < 2 + 1.5 and other.ok
    return f"20 x {codes} within {slowest:.1f} s; {other}", ok


@attack(
    "serve",
    "20 slowloris heads (a header byte every 0.5 s)",
    before="no head deadline could be set",
    expected="408 at the 2 s head deadline (+1.5 s), others served",
    bound_s=30,
)
def slowloris_head(s):
    return _slow(s, b"POST /predict HTTP/1.1\r\nHost: x\r\nX-A: ", b"a")


@attack(
    "serve",
    "20 slow bodies (a body byte every 0.5 s)",
    before="no body deadline could be set",
    expected="408 at the 2 s body deadline (+1.5 s), others served",
    bound_s=30,
)
def slow_body(s):
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    return _slow(s, head + b'{"x": [', b"1")


@attack(
    "serve",
    "declared Content-Length: 10 GB",
    before="not refused before reading",
    expected="413 within 1 s, connection closed",
    bound_s=20,
)
def ten_gb(s):
    srv = s["serve"]
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
    answer, first, closed = raw(srv.port, head + b"[" * 4096)
    code = status_of(answer)
    ok = code == 413 and first < 1 and b"connection: close" in answer.lower() and closed < 5
    return f"{code} in {first * 1000:.0f} ms, closed after {closed:.1f} s", ok


@attack(
    "serve",
    "chunked body over the 1 MiB limit (sent until the server closes, 256 MB at most)",
    before="after a 413 the server read and discarded ~210 MB",
    expected="413; connection closed within the 2 s lingering close (+2 s); RSS +<32 MB",
    bound_s=40,
)
def over_limit(s):
    srv = s["serve"]
    rss0 = rss_mb(srv.pid)
    sock = socket.create_connection((HOST, srv.port), timeout=15)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b"1" * 0x10000 + b"\r\n"
    sent = [0]
    t0 = time.monotonic()

    def pump() -> None:
        try:
            while sent[0] < (256 << 20):
                sock.sendall(chunk)
                sent[0] += 0x10000
        except OSError:
            pass

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    answer, first = b"", float("nan")
    try:
        while chunk_in := sock.recv(65536):
            if not answer:
                first = time.monotonic() - t0
            answer += chunk_in
    except OSError:
        pass
    closed = time.monotonic() - t0
    sock.close()
    t.join(10)
    grew = rss_mb(srv.pid) - rss0
    code = status_of(answer)
    ok = code == 413 and closed - first < 2 + 2 and grew < 32
    return f"{code} after {first:.2f} s, closed {closed - first:.1f} s later; {sent[0] / 2**20:.0f} MB sent in all; RSS {grew:+.0f} MB", ok


def _post_model(s, payload: dict[str, Any]) -> tuple[int, dict[str, list[str]], str]:
    status, headers, body, _ = request("POST", s["model"].url + "/predict", json.dumps(payload).encode())
    return status, headers, body.decode(errors="replace")


@attack(
    "model",
    "exception text in a 500 (preprocess raises with a token and a path)",
    before="500 body: `RuntimeError: secret token=sk-LIVE-123456 in /home/alice/...`; log empty",
    expected="500 with a request id, no secret; the log has it under that id",
    bound_s=20,
)
def secret_500(s):
    status, headers, body = _post_model(s, {"x": [-1, 0, 0, 0]})
    rid = (headers.get("x-request-id") or ["?"])[0]
    time.sleep(0.2)  # the log line is written
    log = s["model"].text()
    leaked = "sk-LIVE" in body or "/home/alice" in body
    logged = f"request {rid}" in log and "sk-LIVE-123456" in log and "Traceback" in log
    ok = status == 500 and not leaked and rid in body and logged
    return f"{status} {body[:90]}; secret in body: {leaked}; in the log under the id: {logged}", ok


@attack(
    "model",
    "exception text in a 422 (validate raises with a database password)",
    before="422 body carried the database URL with its password",
    expected="422 naming the type, no password; the log has it",
    bound_s=20,
)
def secret_422(s):
    status, _, body = _post_model(s, {"db": 1})
    time.sleep(0.2)
    log = s["model"].text()
    ok = status == 422 and "hunter2" not in body and "ConnectionError" in body and "hunter2" in log
    return f"{status} {body[:90]}; password in body: {'hunter2' in body}; in the log: {'hunter2' in log}", ok


@attack(
    "model",
    "NaN output",
    before="NaN became `null` in the JSON without a word",
    expected="500, never a 200 with null; NonFiniteOutput in the log",
    bound_s=20,
)
def nan_output(s):
    status, _, body = _post_model(s, {"x": [7, 0, 0, 0]})
    time.sleep(0.2)
    logged = "NonFiniteOutput" in s["model"].text()
    ok = status == 500 and "null" not in body and logged
    return f"{status} {body[:70]}; NonFiniteOutput logged: {logged}", ok


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@attack(
    "model",
    "a model keeping 10 MB a request, 30 requests",
    before="234 -> 534 MB with nothing in /metrics",
    expected="/metrics' resident memory grows with the requests (>= 200 MB, as /proc says)",
    bound_s=40,
)
def leak(s):
    srv = s["model"]
    m0 = request("GET", srv.url + "/metrics")[2].decode()
    rss0 = rss_mb(srv.pid)
    codes = {_post_model(s, {"x": [5, 0, 0, 0]})[0] for _ in range(30)}
    m1 = request("GET", srv.url + "/metrics")[2].decode()
    grew_proc = rss_mb(srv.pid) - rss0
    grew_metric = (_metric(m1, "process_resident_memory_bytes") - _metric(m0, "process_resident_memory_bytes")) / 2**20
    requests_seen = _metric(m1, "servescope_requests_total") - _metric(m0, "servescope_requests_total")
    ok = codes == {200} and grew_metric >= 200 and abs(grew_metric - grew_proc) < 50 and requests_seen >= 30
    return f"{sorted(codes)}; /metrics resident memory +{grew_metric:.0f} MB over {requests_seen:.0f} requests (/proc: +{grew_proc:.0f} MB)", ok


@attack(
    "model",
    "infer hangs for one input (--timeout 1s), under servescope serve",
    before="/health, /ready, /predict froze (8 s timeouts); SIGTERM ignored 10 s; /ready 200 over a dead worker",
    expected="/health and /ready answer < 1 s while hung; exit status 70 with a log line",
    bound_s=40,
)
def hang(s):
    srv = s["model"]
    hung: list[int] = []
    t = threading.Thread(target=lambda: hung.append(_post_model(s, {"x": [13, 0, 0, 0]})[0]), daemon=True)
    t.start()
    time.sleep(0.3)  # the hanging batch is in the model now
    probes = [request("GET", srv.url + p, timeout=5) for p in ("/health", "/ready", "/health")]
    slowest = max(p[3] for p in probes)
    try:
        code = srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        code = None
    t.join(10)
    logged = "exiting with status 70" in srv.text()
    ok = slowest < 1 and all(p[0] in (200, 503) for p in probes) and code == 70 and logged
    probe_codes = [p[0] for p in probes]
    return f"/health,/ready,/health {probe_codes}, slowest {slowest * 1000:.0f} ms; hung request: {hung[0] if hung else 'none'}; exit {code}, logged: {logged}", ok


def _bench(s, path: str, n: int, timeout: float, concurrency: int = 2) -> tuple[int, dict[str, Any], float, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        rc, _, err, seconds, peak = cli(["bench", s["hostile"].url + path, "-c", str(concurrency), "-n", str(n), "--warmup", "0", "--json", str(out)], timeout=timeout)
        data = json.loads(out.read_text()) if out.exists() else {}
    return rc, data, seconds, peak, err


@attack(
    "bench",
    "bench vs Server-Timing dur=1e308 (200 requests)",
    before="dur=1e13 or 1e300: OverflowError traceback, the run's report lost",
    expected="exit 0, a report of 200 requests, 200 headers counted malformed",
    bound_s=60,
)
def bench_huge_dur(s):
    rc, data, seconds, _, err = _bench(s, "/huge-dur", 200, 50)
    count = (data.get("latency") or {}).get("count")
    st = find_key(data, "server_timing") or {}
    ok = rc == 0 and count == 200 and st.get("malformed") == 200 and "Traceback" not in err
    return f"exit {rc} in {seconds:.1f} s; report of {count} requests, malformed {st.get('malformed')}", ok


@attack(
    "bench",
    "bench vs 1 MB of Server-Timing a response (400 requests)",
    before="~9 MB kept a response: 3.6 GB, 125 s",
    expected="exit 0, a report of 400, bench's peak RSS < 300 MB, < 60 s",
    bound_s=90,
)
def bench_big_header(s):
    rc, data, seconds, peak, _ = _bench(s, "/big-timing", 400, 80)
    count = (data.get("latency") or {}).get("count")
    st = find_key(data, "server_timing") or {}
    ok = rc == 0 and count == 400 and peak < 300 and seconds < 60
    return f"exit {rc} in {seconds:.1f} s; report of {count}, too_large {st.get('too_large')}; bench peak RSS {peak:.0f} MB", ok


@attack(
    "bench",
    "bench vs 20,000 Server-Timing lines a response (c=1, 100 requests)",
    before="bench p50 246 ms where curl saw 9.7 ms",
    expected="exit 0; bench p50 <= 2x a plain client's median (one at a time) + 5 ms",
    bound_s=90,
)
def bench_many_lines(s):
    url = s["hostile"].url + "/many-timing"
    plain = statistics.median(request("GET", url)[3] for _ in range(9)) * 1000
    rc, data, seconds, _, _ = _bench(s, "/many-timing", 100, 80, concurrency=1)
    p50 = (data.get("latency") or {}).get("p50_ms") or float("nan")
    ok = rc == 0 and (data.get("latency") or {}).get("count") == 100 and p50 <= 2 * plain + 5
    return f"exit {rc} in {seconds:.1f} s; bench p50 {p50:.1f} ms, plain client (http.client) median {plain:.1f} ms", ok


def _said(err: str) -> str:
    """The CLI's one line, less its ``servescope: error: cannot fetch ... URL:`` lead."""
    line = err.strip().splitlines()[-1] if err.strip() else ""
    return re.sub(r"^servescope: error: (cannot fetch a report from )?\S+: ", "", line)[:110]


def _one_line_refusal(rc: int, err: str) -> bool:
    return rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@attack(
    "report",
    f"report URL on a server dripping a byte every {DRIP_S:.0f} s",
    before="never finished (the timeout was per read)",
    expected="exit 2, one line, within the 30 s deadline (+5 s)",
    bound_s=60,
)
def report_drip(s):
    rc, _, err, seconds, _ = cli(["report", s["hostile"].url + "/drip"], timeout=50)
    ok = _one_line_refusal(rc, err) and seconds < 35
    return f"exit {rc} in {seconds:.1f} s: {_said(err)}", ok


@attack(
    "report",
    "report URL answering 1,000 MB (chunked, no length)",
    before="read whole: 3.1 GB",
    expected="exit 2, one line, peak RSS < 64 MiB cap + 200 MB, < 30 s",
    bound_s=60,
)
def report_big(s):
    rc, _, err, seconds, peak = cli(["report", s["hostile"].url + "/big"], timeout=50)
    ok = _one_line_refusal(rc, err) and peak < 264 and seconds < 30
    return f"exit {rc} in {seconds:.1f} s, peak RSS {peak:.0f} MB: {_said(err)}", ok


@attack(
    "report",
    "report URL redirecting to ftp://",
    before="followed",
    expected="exit 2, one line naming the scheme",
    bound_s=30,
)
def report_ftp(s):
    rc, _, err, seconds, _ = cli(["report", s["hostile"].url + "/to-ftp"], timeout=25)
    ok = _one_line_refusal(rc, err) and "ftp://" in err
    return f"exit {rc} in {seconds:.1f} s: {_said(err)}", ok


@attack(
    "report",
    "report URL of 100,000 stages",
    before="rendered for minutes",
    expected="exit 0 within 20 s, the rest counted",
    bound_s=40,
)
def report_stages(s):
    rc, out, _, seconds, _ = cli(["report", s["hostile"].url + "/stages"], timeout=35)
    more = re.search(r"[\d,]+ more stages not shown", out)
    ok = rc == 0 and seconds < 20 and more is not None
    return f"exit {rc} in {seconds:.1f} s; {more.group(0) if more else 'no count of the rest'}", ok


@attack(
    "report",
    "printing a report: escapes and rich markup in stage names and a finding",
    before="clear screen / window title written verbatim; [link=...] a hyperlink; a stage `[/]`: MarkupError",
    expected="exit 0; no ESC, BEL, C1 or bidi override in the output; markup printed as text",
    bound_s=30,
)
def report_escapes(s):
    rc, out, err, seconds, _ = cli(["report", s["hostile"].url + "/escapes"], timeout=25)
    bad = sorted({f"U+{ord(c):04X}" for c in out if c in "\x1b\x07\x9b\u202e"})
    literal = all(m in out for m in ("[link=https://evil.example]click[/link]", "[/]", "[bold red]loud[/]"))
    ok = rc == 0 and not bad and literal and "Traceback" not in err
    why = "" if rc == 0 else f": {_said(err)}"
    return f"exit {rc} in {seconds:.1f} s{why}; control characters in the output: {bad or 'none'}; markup as text: {literal}", ok


@attack(
    "report",
    "printing a report whose latency.p50_ms is a string",
    before="TypeError traceback half-way through the table",
    expected="exit 2, one line naming the field",
    bound_s=30,
)
def report_wrong_type(s):
    rc, _, err, seconds, _ = cli(["report", s["hostile"].url + "/wrong-type"], timeout=25)
    ok = _one_line_refusal(rc, err) and "p50_ms" in err
    return f"exit {rc} in {seconds:.1f} s: {_said(err)}", ok


def _timing_lines(headers: dict[str, list[str]]) -> list[str]:
    return headers.get("server-timing", [])


@attack(
    "middleware",
    'app sends `cache;desc="hit", db;dur=2.5;desc="primary"`',
    before='rewritten to `db;dur=2.500, total;...`: desc and cache dropped',
    expected="200; the app's line passed as written; the middleware's line added",
    bound_s=20,
)
def mw_own_timing(s):
    status, headers, body, _ = request("GET", s["middleware"].url + "/own-timing")
    lines = _timing_lines(headers)
    ok = status == 200 and OWN_TIMING.decode() in lines and len(lines) == 2 and body == b"app body /own-timing"
    return f"{status}; Server-Timing lines: {lines}", ok


@attack(
    "middleware",
    "app sends `db;dur=1e308, db;dur=1e308`",
    before="the app's 200 became a 500",
    expected="200, the app's header passed as written",
    bound_s=20,
)
def mw_huge_dur(s):
    status, headers, body, _ = request("GET", s["middleware"].url + "/huge-dur")
    lines = _timing_lines(headers)
    ok = status == 200 and HUGE_TIMING.decode() in lines and body == b"app body /huge-dur"
    return f"{status}; Server-Timing lines: {lines}", ok


@attack(
    "middleware",
    "app's response headers given as a generator",
    before="every app header dropped",
    expected="200 with the app's headers",
    bound_s=20,
)
def mw_generator(s):
    status, headers, _, _ = request("GET", s["middleware"].url + "/generator")
    ok = status == 200 and headers.get("x-app") == ["kept"] and headers.get("content-type") == ["text/plain"]
    return f"{status}; x-app {headers.get('x-app')}, content-type {headers.get('content-type')}", ok


@attack(
    "middleware",
    "app with its own /metrics route, exporter given",
    before="the exporter's /metrics answered instead",
    expected="the app's /metrics answers",
    bound_s=20,
)
def mw_metrics(s):
    status, _, body, _ = request("GET", s["middleware"].url + "/metrics")
    ok = status == 200 and body == b"app body /metrics"
    return f"{status}; body {body[:40]!r}", ok


# -- the run ------------------------------------------------------------------------------------

SERVERS: dict[str, tuple[list[str], str]] = {
    "serve": (serve_cmd("examples/mlp_serve.py:MLP", *LIMITS), "/ready"),
    "model": (serve_cmd("bench/attack.py:Hostile", "--timeout", "1s"), "/ready"),
    "hostile": (uvicorn_cmd("hostile"), "/ok"),
    "middleware": (uvicorn_cmd("middleware"), "/generator"),
}
NEEDS = {"serve": ["serve"], "model": ["model"], "bench": ["hostile"], "report": ["hostile"], "middleware": ["middleware"]}


def run_one(a: Attack, servers: dict[str, Server]) -> tuple[str, bool, float]:
    """The attack on a thread with its bound: past it, FAIL (its sockets time out on their own)."""
    result: list[tuple[str, bool]] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(a.run(servers))
        except BaseException as exc:  # a crashed attack is a failed one, with its reason
            error.append(exc)

    t0 = time.monotonic()
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(a.bound_s)
    seconds = time.monotonic() - t0
    if result:
        return result[0][0], result[0][1], seconds
    if error:
        return f"the attack failed: {type(error[0]).__name__}: {error[0]}", False, seconds
    return f"no result within its bound of {a.bound_s:.0f} s", False, seconds


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(NEEDS), action="append", help="run these groups only")
    parser.add_argument("--serve", choices=["hostile", "middleware"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:  # a server role, started by the run below
        import uvicorn

        app = hostile_app if args.serve == "hostile" else middleware_app()
        uvicorn.run(app, host=HOST, port=args.port, log_level="error", access_log=False)
        return 0

    groups = args.only or list(NEEDS)
    attacks = [a for a in ATTACKS if a.group in groups]
    t_start = time.monotonic()
    print(f"bench/attack.py, {_dt.datetime.now().isoformat(timespec='seconds')}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, servescope {servescope.__version__}", file=sys.stderr)  # fmt: skip
    rows: list[tuple[Attack, str, bool, float]] = []
    servers: dict[str, Server] = {}
    try:
        for group in groups:
            for name in NEEDS[group]:
                if name not in servers:
                    argv, ready = SERVERS[name]
                    servers[name] = Server(name, argv, ready)
            for a in (a for a in attacks if a.group == group):
                now, ok, seconds = run_one(a, servers)
                rows.append((a, now, ok, seconds))
                print(f"{'PASS' if ok else 'FAIL'} {a.group}: {a.name} ({seconds:.1f} s): {now}", file=sys.stderr, flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    print("| attack | before (issue #18) | now | expected | result |")
    print("|---|---|---|---|---|")
    for a, now, ok, _ in rows:
        print(f"| {cell(a.name)} | {cell(a.before)} | {cell(now)} | {cell(a.expected)} | {'PASS' if ok else 'FAIL'} |")
    failed = sum(not ok for _, _, ok, _ in rows)
    print(f"\n{len(rows) - failed} of {len(rows)} attacks pass, in {time.monotonic() - t_start:.0f} s.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
