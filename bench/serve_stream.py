"""#15's streaming benchmark: a decoder streamed token by token, servescope.serve against the
FastAPI StreamingResponse endpoint people write.

    python bench/serve_stream.py [--seconds 10] [--neighbour]

The decoder of examples/serve/generate.py (GPT-2 shape, 2 layers, 128 wide, KV cache, greedy),
32 prompts of 2 to 60 words cycled, 32 new tokens each, Server-Sent Events. Each server alone
on loopback, loaded by servescope bench at concurrency 8 and 1: tokens per second in all, time
to the first token, the gaps between tokens. Then the physical limits, in this process: the
same decode loop one sequence at a time, and in batches of 8. ``--neighbour`` keeps one core
busy with another process for the whole run, the same for every server (#24).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _servers import each_server, free_port, neighbour  # bench/ is on the path: run as a script

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
TOKENS = 32
WORDS = "the weather in the mountains this weekend will be cold and clear with some snow on the higher peaks".split()


def prompts(n: int) -> list[str]:
    return [" ".join(WORDS[j % len(WORDS)] for j in range(2 + (i * 7) % 59)) for i in range(n)]


def bench(url: str, bodies: list[Path], c: int, seconds: float, out: Path) -> dict:
    args = [sys.executable, "-m", "servescope", "bench", url, "-c", str(c), "-d", f"{seconds:g}s", "--warmup", "1s",
            "-H", "Accept: text/event-stream", "--json", str(out)]  # fmt: skip
    for b in bodies:
        args += ["--body", str(b)]
    subprocess.run(args, capture_output=True, timeout=seconds + 120, check=False)
    data = json.loads(out.read_text())
    s = data["load"]["stream"]
    return {
        "rps": data["load"]["throughput_rps"], "tok_s": s["chunks_per_s"], "ttft50": s["ttft"]["p50_ms"], "ttft99": s["ttft"]["p99_ms"],
        "itl50": s["itl"]["p50_ms"], "itl99": s["itl"]["p99_ms"], "errors": sum(data["errors"].values()),
    }  # fmt: skip


def decode_loop(batch: int, seconds: float) -> float:
    """Tokens per second of the example's own batched decode, no server."""
    import torch

    sys.path.insert(0, str(HERE.parent / "examples" / "serve"))
    from generate import Generate

    g = Generate()
    g.model = g.load("cpu").eval()
    texts = prompts(32)
    made, t0, i = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        items = [g.preprocess({"prompt": texts[(i + k) % 32], "max_tokens": TOKENS}) for k in range(batch)]
        i += batch
        with torch.inference_mode():
            for _ in g.infer(g.collate(items)):
                made += batch
    return made / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--neighbour", action="store_true", help="keep one core busy with another process for the whole run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    bodies = []
    for i, p in enumerate(prompts(32)):
        bodies.append(tmp / f"b{i}.json")
        bodies[-1].write_text(json.dumps({"prompt": p, "max_tokens": TOKENS}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVERS), str(HERE.parent / "src")])}
    port = free_port()
    uv = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    # servescope.serve as its command line starts it (it chooses OpenMP's wait policy before
    # the file imports torch: docs/serve.md "A shared machine")
    ours = [sys.executable, "-m", "servescope", "serve", "gen_servescope.py:Generate", "--host", "127.0.0.1", "--port", str(port), "--max-batch-size", "16"]
    servers = {
        "servescope.serve (max_batch_size 16)": ours,
        "FastAPI StreamingResponse (correct)": [*uv, "gen_fastapi:app"],
    }
    url = f"http://127.0.0.1:{port}/predict"

    def measure(name: str, pgid: int) -> dict:
        bench(url, bodies, 8, 2, tmp / "warm.json")
        return {8: bench(url, bodies, 8, args.seconds, tmp / "c8.json"), 1: bench(url, bodies, 1, args.seconds / 2, tmp / "c1.json")}

    with neighbour(args.neighbour):
        rows = each_server(servers, url, bodies[0].read_bytes(), measure, cwd=SERVERS, env=env)
        one, eight = decode_loop(1, args.seconds / 2), decode_loop(8, args.seconds / 2)
    print(f"decoder of examples/serve/generate.py, {TOKENS} tokens per request, SSE, servescope bench, {args.seconds:g} s at c=8, "
          f"{args.seconds / 2:g} s at c=1, loopback, {os.cpu_count()} CPUs"
          f"{', a neighbour keeping one core busy' if args.neighbour else ''}")  # fmt: skip
    print(f"{'server':<38} {'c':>2} {'req/s':>7} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'errors':>6}")
    for name, r in rows.items():
        if "skipped" in r:
            print(f"{name:<38} skipped: {r['skipped']}")
            continue
        for c in (8, 1):
            x = r[c]
            print(f"{name:<38} {c:>2} {x['rps']:>7.1f} {x['tok_s']:>9.0f} {x['ttft50']:>9.2f} {x['ttft99']:>9.2f} {x['itl50']:>8.2f} {x['itl99']:>8.2f} {x['errors']:>6}")
    print(f"{'decode loop, one sequence (the limit)':<41} {'':>7} {one:>9.0f}")
    print(f"{'decode loop, batches of 8 (the limit)':<41} {'':>7} {eight:>9.0f}")
    ours, theirs = rows.get("servescope.serve (max_batch_size 16)", {}), rows.get("FastAPI StreamingResponse (correct)", {})
    if 8 in ours and 8 in theirs:
        print(f"servescope.serve / FastAPI at c=8: tokens/s x{ours[8]['tok_s'] / theirs[8]['tok_s']:.2f}, "
              f"TTFT p99 x{ours[8]['ttft99'] / theirs[8]['ttft99']:.2f}, ITL p99 x{ours[8]['itl99'] / theirs[8]['itl99']:.2f}; "
              f"c=1 TTFT p50 {ours[1]['ttft50'] - theirs[1]['ttft50']:+.2f} ms")  # fmt: skip
        print(f"servescope.serve tokens/s at c=8 / decode loop in batches of 8: {ours[8]['tok_s'] / eight:.0%}")


if __name__ == "__main__":
    main()
