"""servescope.serve against a naive FastAPI endpoint and LitServe (batched), same model, same run.

    python bench/serve_compare.py [--seconds 8]

Each server runs alone on loopback; wrk (Debian package `wrk`) loads it at concurrency 1
and 16 with the same JSON body; litserve is installed only for this benchmark
(`pip install litserve`); a server that cannot start is skipped with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _servers import free_port, stop_group, wait_ready  # bench/ is on the path: run as a script

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"


def commands(port: int) -> dict[str, list[str]]:
    uv = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    return {
        "servescope.serve (max_batch_size 16)": [*uv, "servescope_mlp:app"],
        "FastAPI async def (naive)": [*uv, "fastapi_naive:app"],
        "LitServe batched (16, 5 ms)": [sys.executable, str(SERVERS / "litserve_batched.py"), str(port)],
    }


def wrk(url: str, concurrency: int, seconds: float, script: str) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency", "-s", script, url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip

    def ms(label: str) -> float:
        m = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": ms("50"), "p90": ms("90"), "p99": ms("99"),
        "errors": int(bad.group(1)) if bad else 0,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    tmp = tempfile.mkdtemp()
    body = Path(tmp, "x.json")
    body.write_text(json.dumps({"x": [0.1] * 256}))
    script = Path(tmp, "post.lua")
    script.write_text(
        f'wrk.method = "POST"\nlocal f = io.open("{body}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVERS), str(HERE.parent / "src")])}
    rows = []
    port = free_port()
    for name, cmd in commands(port).items():
        url = f"http://127.0.0.1:{port}/predict"
        # a session of its own: LitServe's worker processes go with it (killpg), not on spinning
        proc = subprocess.Popen(cmd, cwd=SERVERS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_ready(url, body.read_bytes(), proc)
            wrk(url, 4, 2, str(script))  # warm-up
            for c in (1, 16):
                rows.append((name, c, wrk(url, c, args.seconds, str(script))))
        except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash
            rows.append((name, 0, {"skipped": str(exc)}))
        finally:
            stop_group(proc)
            time.sleep(1)
    print(f"MLP 256-2048-2048-10, wrk -t1, {args.seconds:g} s per row, loopback, {os.cpu_count()} CPUs")
    print(f"{'server':<40} {'c':>3} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'non-2xx':>8}")
    for name, c, r in rows:
        if "skipped" in r:
            print(f"{name:<40} skipped: {r['skipped']}")
            continue
        print(f"{name:<40} {c:>3} {r['rps']:>8.0f} {r['p50']:>8.2f} {r['p90']:>8.2f} {r['p99']:>8.2f} {r['errors']:>8}")


if __name__ == "__main__":
    main()
