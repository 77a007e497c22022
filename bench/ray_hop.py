"""What Ray Serve's proxy and router add: the same model served directly and on Ray, same run.

    python bench/ray_hop.py [--seconds 5]

Servers, one at a time on loopback, each loaded by `servescope bench` (one local generator)
at concurrency 1 and 8 with the same JSON body:
  - `servescope serve examples/mlp_serve.py:MLP` (uvicorn, no proxy): the anchor;
  - `servescope serve ... --ray --replicas 1` and `--replicas 2` (Ray's HTTP proxy in front).
Prints throughput, p50/p99, and the gap beyond the server's own total (``network+client``
direct, ``proxy+network`` on Ray), and ratios against the direct server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_compare import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent

BODY = json.dumps({"x": [0.1] * 256}).encode()


def start(ray: bool, replicas: int, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "servescope", "serve", "examples/mlp_serve.py:MLP", "--port", str(port), "--max-batch-size", "16"]
    if ray:
        cmd += ["--ray", "--replicas", str(replicas)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def bench(url: str, concurrency: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        body, out = Path(tmp, "body.json"), Path(tmp, "out.json")
        body.write_bytes(BODY)
        subprocess.run(
            [sys.executable, "-m", "servescope", "bench", url, "--body", str(body), "-c", str(concurrency),
             "-d", f"{seconds}s", "--warmup", "1s", "--json", str(out)],
            check=True, stdout=subprocess.DEVNULL, timeout=seconds + 120,
        )  # fmt: skip
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    setups = [("direct (uvicorn)", False, 1), ("Ray Serve, 1 replica", True, 1), ("Ray Serve, 2 replicas", True, 2)]
    rows = []
    for name, ray, replicas in setups:
        port = free_port()
        proc = start(ray, replicas, port)
        url = f"http://127.0.0.1:{port}/predict"
        try:
            wait_ready(url, proc, timeout=180)
            for c in (1, 8):
                rep = bench(url, c, args.seconds)
                gap = rep["stages"].get("proxy+network") or rep["stages"].get("network+client") or {}
                rows.append((name, c, rep["load"]["throughput_rps"], rep["latency"]["p50_ms"], rep["latency"]["p99_ms"], gap.get("p50_ms"), rep["stages"].get("receive", {}).get("p50_ms")))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    anchor = {c: (rps, p50) for name, c, rps, p50, *_ in rows if name.startswith("direct")}
    print(f"{'server':24} {'c':>3} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'gap p50':>8} {'recv p50':>9} {'rps x':>6} {'p50 x':>6}")
    for name, c, rps, p50, p99, gap, recv in rows:
        a_rps, a_p50 = anchor[c]
        print(f"{name:24} {c:>3} {rps:>8.1f} {p50:>8.2f} {p99:>8.2f} {gap or 0:>8.2f} {recv or 0:>9.3f} {rps / a_rps:>6.2f} {p50 / a_p50:>6.2f}")


if __name__ == "__main__":
    main()
