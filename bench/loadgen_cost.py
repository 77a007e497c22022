"""The load generator's own CPU per request, against wrk and a bare Python client, same run.

    python bench/loadgen_cost.py [--seconds 5]
    python bench/loadgen_cost.py --rates 10,50,200,1000 --seconds 10    # at the rates users run

Starts a bare ASGI app on uvicorn (loopback), then loads it with each generator at
concurrency 16, one after another, twice; reads each generator's CPU time from the kernel
(its process's rusage) and divides by the requests it completed. Then the same for streamed
responses (20 chunks each, chunked and Server-Sent Events, no pause between chunks), where
servescope times every chunk: wrk reads the same responses without timing their chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from e2e.conftest import start_server, stop  # noqa: E402

FLOOR = r'''
import asyncio, sys, time, uvloop
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
REQ = f"GET /fast HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
count = 0
class P(asyncio.Protocol):
    def connection_made(self, t): self.t = t; t.write(REQ)
    def data_received(self, d):
        global count
        count += 1
        self.t.write(REQ)
async def main():
    loop = asyncio.get_running_loop()
    for _ in range(16):
        await loop.create_connection(P, host, port)
    await asyncio.sleep(seconds)
    print(count)
uvloop.run(main())
'''


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd: list[str]) -> tuple[float, str]:
    c0 = child_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return child_cpu() - c0, out


def by_rate(port: int, rates: list[float], seconds: float) -> None:
    """servescope bench at fixed rates (the rates users run, not saturation): its load loop's
    CPU per request (self-reported) and the whole process's (start-up and report included),
    plain and streamed (SSE, 20 events 5 ms apart)."""
    print(f"servescope bench CPU per request at fixed rates, {seconds:g}s each (loopback, bare ASGI app)")
    print(f"  {'rate':>8} {'kind':<24} {'load loop us/req':>17} {'whole process us/req':>21}")
    for rate in rates:
        for kind, path in (("plain", "/fast"), ("streamed (SSE, 20 events)", "/stream?tokens=20&ttft_ms=0&gap_ms=5&sse=1")):
            with tempfile.TemporaryDirectory() as tmp:
                report = os.path.join(tmp, "r.json")
                cpu, _ = run([sys.executable, "-m", "servescope", "bench", f"http://127.0.0.1:{port}{path}", "-r", f"{rate:g}", "-d", f"{seconds:g}",
                              "--warmup", "0", "--json", report])  # fmt: skip
                data = json.loads(Path(report).read_text())
            n = data["load"]["requests"]["measured"] + data["load"]["requests"]["warmup"] + 1
            loop_us = data["load"]["generator"]["cpu_us_per_request"]
            print(f"  {rate:>8g} {kind:<24} {loop_us:>17.1f} {cpu / n * 1e6:>21.1f}")
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=None,
                    help="instead: servescope bench's CPU per request at these fixed rates (e.g. 10,50,200,1000)")
    args = ap.parse_args()
    proc, port = start_server("servers:app")
    if args.rates:
        try:
            by_rate(port, args.rates, args.seconds)
        finally:
            stop(proc)
        return
    url = f"http://127.0.0.1:{port}/fast"
    rows: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(2):
            if shutil.which("wrk"):
                cpu, out = run(["wrk", "-t1", "-c16", f"-d{args.seconds:g}s", url])
                n = int(re.search(r"(\d+) requests in", out).group(1))
                rows.setdefault("wrk -t1 -c16", []).append((cpu / n * 1e6, n / args.seconds))
            cpu, out = run([sys.executable, "-c", FLOOR, "127.0.0.1", str(port), str(args.seconds)])
            n = int(out.strip())
            rows.setdefault("bare uvloop Protocol client (Python floor)", []).append((cpu / n * 1e6, n / args.seconds))
            with tempfile.TemporaryDirectory() as tmp:
                report = os.path.join(tmp, "r.json")
                cpu, _ = run([sys.executable, "-m", "servescope", "bench", url, "-c", "16", "-d", f"{args.seconds:g}", "--warmup", "0", "--json", report])
                data = json.loads(Path(report).read_text())
                n = data["load"]["requests"]["measured"] + data["load"]["requests"]["warmup"] + 1
                rows.setdefault("servescope bench -c 16 (whole process: startup, report)", []).append((cpu / n * 1e6, data["load"]["throughput_rps"]))
                rows.setdefault("servescope bench -c 16 (load loop, self-reported)", []).append(
                    (data["load"]["generator"]["cpu_us_per_request"], data["load"]["throughput_rps"])
                )
            time.sleep(0.5)
            for kind, query in (("chunked", "tokens=20&ttft_ms=0&gap_ms=0"), ("SSE", "tokens=20&ttft_ms=0&gap_ms=0&sse=1")):
                stream_url = f"http://127.0.0.1:{port}/stream?{query}"
                if shutil.which("wrk"):
                    cpu, out = run(["wrk", "-t1", "-c16", f"-d{args.seconds:g}s", stream_url])
                    n = int(re.search(r"(\d+) requests in", out).group(1))
                    rows.setdefault(f"wrk -t1 -c16, streamed ({kind}, 20 chunks)", []).append((cpu / n * 1e6, n / args.seconds))
                with tempfile.TemporaryDirectory() as tmp:
                    report = os.path.join(tmp, "r.json")
                    run([sys.executable, "-m", "servescope", "bench", stream_url, "-c", "16", "-d", f"{args.seconds:g}", "--warmup", "0", "--json", report])
                    data = json.loads(Path(report).read_text())
                    assert data["load"]["stream"]["chunks"] >= 19 * data["load"]["requests"]["ok"], "every chunk was counted"
                    rows.setdefault(f"servescope bench -c 16, streamed ({kind}, 20 chunks; load loop)", []).append(
                        (data["load"]["generator"]["cpu_us_per_request"], data["load"]["throughput_rps"])
                    )
                time.sleep(0.5)
    finally:
        stop(proc)
    print(f"load generator CPU per request against a bare ASGI app on uvicorn, c=16, {args.seconds:g}s x2 (median)")
    for name, vals in rows.items():
        us = statistics.median(v[0] for v in vals)
        rps = statistics.median(v[1] for v in vals)
        print(f"  {name:<45} {us:6.1f} us/request   {rps:9,.0f} req/s")


if __name__ == "__main__":
    main()
