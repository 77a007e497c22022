"""What the doctor's probes add to a request, against the same handler without them.

    python bench/probe_overhead.py

Calls two handlers in a trace (a small MLP endpoint, and one that returns a 200x384 output
through json.dumps) with and without the probes installed, interleaved, median of repeats;
prints us per request and the difference.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from servescope import trace
from servescope.doctor.probes import Probes, new_evidence, set_evidence

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).eval()
BIG = torch.nn.Linear(384, 384).eval()
X = [0.1] * 256


def mlp_handler() -> str:
    x = torch.tensor(X).unsqueeze(0)
    with torch.inference_mode():
        y = MLP(x)
    return json.dumps({"y": y[0].tolist()})


def big_handler() -> str:
    with torch.inference_mode():
        y = BIG(torch.ones(200, 384))
    return json.dumps({"v": y.tolist()})


def per_request(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        set_evidence(new_evidence())
        with trace():
            fn()
    return (time.perf_counter_ns() - t0) / n / 1000


def main() -> None:
    rows = {}
    for name, fn, n in (("MLP 256-512-10, JSON out", mlp_handler, 500), ("200x384 output through json.dumps", big_handler, 40)):
        plain, probed = [], []
        for _ in range(7):
            plain.append(per_request(fn, n))
            with Probes():
                probed.append(per_request(fn, n))
        rows[name] = (statistics.median(plain), statistics.median(probed))
    print("probe overhead per request (median of 7 interleaved repeats)")
    for name, (a, b) in rows.items():
        print(f"  {name:<36} without {a:9.1f} us   with probes {b:9.1f} us   +{b - a:7.1f} us ({(b / a - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
