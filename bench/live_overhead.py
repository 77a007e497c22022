"""What `servescope doctor --pid` costs the server it samples (#26): p50 at one client and
throughput at four, with py-spy attached the way the doctor attaches it (every thread, idle
ones too, --nonblocking, at --rate) against the same server alone, A B A B in one run.

    .venv/bin/python bench/live_overhead.py [--rounds 3] [--seconds 5] [--rate 100]

One uvicorn server, two routes: a torch MLP (about 2 ms a request here) and a JSON answer
(about 1 ms): sampling costs most, relatively, where requests are short. Target: p50 and throughput
within 5% of the server alone at the default rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import free_port, stop_group, wait_ready  # noqa: E402

from servescope.doctor.live.spy import Recording  # noqa: E402
from servescope.load.bench import BenchOptions, run_bench  # noqa: E402

APP = textwrap.dedent(
    """
    import torch
    from fastapi import FastAPI

    torch.set_num_threads(1)
    NET = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 256)).eval()
    app = FastAPI()

    @app.post("/mlp")
    def mlp(payload: dict):
        x = torch.tensor(payload["x"], dtype=torch.float32).reshape(-1, 256)
        with torch.inference_mode():
            for _ in range(8):
                y = NET(x)
        return {"y": y[0, :4].tolist()}

    @app.post("/json")
    def rows(payload: dict):
        return {"rows": [{"i": i, "v": i * 0.5} for i in range(200)]}
    """
)
BODY = json.dumps({"x": [0.1] * 256 * 4}).encode()


def measure(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    [rep] = run_bench(BenchOptions(url=url, method="POST", bodies=[BODY], content_type="application/json",
                                   concurrency=[concurrency], duration_s=seconds, warmup_s=0.5, timeout_s=30.0))  # fmt: skip
    return {"p50_ms": rep.latency["p50_ms"], "rps": rep.load.throughput_rps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=100)
    args = ap.parse_args()
    here = Path(tempfile.mkdtemp())
    (here / "app.py").write_text(APP)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                            cwd=here, env=env, start_new_session=True)  # fmt: skip
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/json", BODY, proc)
        for route in ("mlp", "json"):
            for c, what in ((1, "p50_ms"), (4, "rps")):
                alone, sampled = [], []
                for r in range(args.rounds):
                    for arm in ("alone", "sampled") if r % 2 == 0 else ("sampled", "alone"):
                        rec = Recording(proc.pid, args.rate).start() if arm == "sampled" else None
                        try:
                            m = measure(f"{base}/{route}", c, args.seconds)
                        finally:
                            if rec is not None:
                                rec.stop()
                        (sampled if rec else alone).append(m[what])
                a, s = statistics.median(alone), statistics.median(sampled)
                ratio = s / a if what == "p50_ms" else a / s  # above 1: worse when sampled
                rows.append((route, c, what, a, s, ratio, alone, sampled))
                print(f"{route:5} c={c} {what:7} alone {a:9.2f} sampled {s:9.2f} cost {100 * (ratio - 1):+5.1f}%  "
                      f"(rounds alone {[round(x, 2) for x in alone]}, sampled {[round(x, 2) for x in sampled]})", flush=True)  # fmt: skip
    finally:
        stop_group(proc)
    worst = max(r[5] for r in rows)
    print(f"worst cost: {100 * (worst - 1):+.1f}% (target: within 5%) at {args.rate} samples/s")


if __name__ == "__main__":
    main()
