"""Load from outside the doctor's process: the experiments' concurrent blocks on an app.

The doctor serves an app in its own process, and its load generator there shares the GIL
with the app's loop and worker threads. Near 200 requests a second that costs the app several
milliseconds a request, more for the arm with the fix (it answers faster), so a saving at
concurrency came out smaller than the fixed twin's under uvicorn (docs/benchmarks.md, session
13). The experiments' blocks are sent by a helper process instead, as a server's clients are;
the concurrent phase stays in-process (its evidence needs the requests' traces).

    load = OutsideLoad()
    got = load.run(url, "POST", body, "application/json", concurrency=8, requests=32, timeout_s=30, max_seconds=8)
    # [(latency_ms, error or None, first_chunk_ms or None), ...], elapsed_s; None: no helper
    load.close()
"""

from __future__ import annotations

import base64
import json
import select
import subprocess
import sys
import time
from typing import Any

__all__ = ["OutsideLoad", "closed_loop_block"]

#: how long the helper may take to start and answer its first line (imports)
START_S = 60.0


class OutsideLoad:
    """One helper process, started at the first block and kept for the next ones."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.broken = ""

    def run(
        self, url: str, method: str, body: bytes, content_type: str | None, *, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[tuple[float, str | None, float | None]], float] | None:
        """The block's requests as ``(latency_ms, error, first_chunk_ms)``, and its wall time;
        None when no helper could run it (the caller measures in-process instead)."""
        if self.broken:
            return None
        job = {"url": url, "method": method, "body": base64.b64encode(body).decode(), "content_type": content_type,
               "concurrency": concurrency, "requests": requests, "timeout_s": timeout_s, "max_seconds": max_seconds}  # fmt: skip
        try:
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "servescope.doctor.endpoints.outside"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
            wait = START_S + max_seconds + timeout_s + 5.0
            if not select.select([self.proc.stdout], [], [], wait)[0]:
                raise OSError(f"no answer within {wait:g} s")
            line = self.proc.stdout.readline()
            if not line:
                raise OSError(f"the helper ended (exit code {self.proc.poll()})")
            reply = json.loads(line)
        except (OSError, ValueError) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            self.close()
            return None
        return [tuple(r) for r in reply["results"]], reply["elapsed"]  # type: ignore[misc]

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # (its loop ends at the end of its input)
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def closed_loop_block(
    url: str, method: str, body: bytes, content_type: str | None, *, concurrency: int, requests: int, timeout_s: float, max_seconds: float
) -> tuple[list[Any], float]:
    """The load generator's results for one block, and its wall time: new requests until
    ``requests`` have started or ``max_seconds`` passed, each with the whole timeout to answer
    (the drain), then what is still in flight counts as unfinished. In this process (the doctor's
    concurrent phase) or in the helper's."""
    import asyncio

    from ...load.loadgen import URL, LoadGenerator, build_requests

    target = URL.parse(url)
    raw = build_requests(target, method=method, bodies=[body], content_type=content_type if body else None)
    gen = LoadGenerator(target, raw, timeout_s=timeout_s)
    t0 = time.perf_counter()

    async def run() -> list[Any]:
        task = asyncio.ensure_future(gen.closed_loop(concurrency=concurrency, requests=requests, drain_s=timeout_s + 0.5))
        done, _ = await asyncio.wait({task}, timeout=max_seconds)
        if not done:
            gen.stop()
            done, _ = await asyncio.wait({task}, timeout=timeout_s + 2.0)
        return task.result() if done else []

    results = asyncio.run(run())
    return results, time.perf_counter() - t0


def _block(job: dict[str, Any]) -> dict[str, Any]:
    from ...load.loadgen import error_kind

    results, elapsed = closed_loop_block(
        job["url"], job["method"], base64.b64decode(job["body"]), job["content_type"], concurrency=job["concurrency"],
        requests=job["requests"], timeout_s=job["timeout_s"], max_seconds=job["max_seconds"],
    )  # fmt: skip
    out = []
    for r in results:
        times = r.stream[2] if r.stream else None
        out.append(((r[2] - r[1]) / 1e6, error_kind(r), (times[0] - r.sent_ns) / 1e6 if times else None))
    return {"results": out, "elapsed": elapsed}


def main() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(_block(json.loads(line))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
