"""Load from outside the doctor's process: the concurrent phase and the experiments'
concurrent blocks on an app, and once the helper runs, the requests one at a time too.

The doctor serves an app in its own process, and a load generator there shares the GIL with
the app's loop and worker threads. Near 200 requests a second that costs the app several
milliseconds a request, more for the arm with the fix (it answers faster), so a saving at
concurrency came out smaller than the fixed twin's under uvicorn (docs/benchmarks.md, session
13), and beside a core-burning neighbour the concurrent phase's p50 came out 1.35-1.75x a
server's, against 1.1-1.2x from a helper (session 21). The load is sent by a helper process
instead, as a server's clients are (in this process only where no helper can run), and in a
session of its own: where the kernel shares the CPUs between sessions (autogroup), a helper in
the doctor's session took part of the endpoint's share beside a neighbour, and an `async def`
forward moved to threads measured 7-12 ms of saving at c=8 where its `def` twin under uvicorn
saved 17 (18-19 with the helper apart; docs/benchmarks.md, session 30). Each answer
names its request's id in Server-Timing, and the helper hands the ids back, so the phase still
finds each request's trace.

    load = OutsideLoad()
    load.start()                  # before the clock starts: the helper's imports are not the load's
    got = load.run(url, "POST", body, "application/json", concurrency=8, requests=32, timeout_s=30, max_seconds=8)
    # [Row(latency_ms, status, error, first_chunk_ms, request_id, chunk_gaps_ms), ...], elapsed_s; None: no helper
    sents = load.one_by_one("127.0.0.1", 8000, "POST", "/predict", body, [headers] * 5, timeout_s=30, max_seconds=8)  # with answers
    load.close()
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

from ...environment import HELPERS, retire_helper
from .client import Sent, send_in_turn

__all__ = ["OutsideLoad", "Row", "closed_loop_block", "rows_of"]

#: how long the helper may take to start and say it is ready (imports)
START_S = 60.0
#: the helper's first line, once its imports are done
READY = b"ready\n"
#: the id each answer names in its Server-Timing (endpoints/http.py)
_ID_IN_TIMING = re.compile(rb'servescope-doctor-request;desc="([^"]*)"')


class Row(NamedTuple):
    """One request of a block as the doctor needs it, from either process."""

    latency_ms: float
    status: int | None
    error: str | None
    first_chunk_ms: float | None
    #: the id its answer named in Server-Timing (finds its trace), or None
    request_id: str | None
    chunk_gaps_ms: list[float]


def rows_of(results: list[Any]) -> list[Row]:
    """The load generator's results as rows (``UNFINISHED``'s word is the generator's own)."""
    from ...load.loadgen import error_kind

    out = []
    for r in results:
        times = r.stream[2] if r.stream else None
        m = _ID_IN_TIMING.search(r.server_timing) if isinstance(r.server_timing, bytes) else None
        out.append(Row(
            (r.done_ns - r.sent_ns) / 1e6, r.status or None, error_kind(r), (times[0] - r.sent_ns) / 1e6 if times else None,
            m.group(1).decode("latin-1") if m else None, [(b - a) / 1e6 for a, b in zip(times, times[1:])] if times else [],
        ))  # fmt: skip
    return out


class OutsideLoad:
    """One helper process, started at the first block and kept for the next ones."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.broken = ""
        self._stderr: Any = None  # (what the helper said, for why it broke)

    def start(self) -> bool:
        """Start the helper and wait for its imports (once); False when it cannot run."""
        if self.proc is not None or self.broken:
            return not self.broken
        try:
            self._stderr = tempfile.TemporaryFile()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "servescope.doctor.endpoints.outside"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                # a session of its own: where the kernel shares the CPUs between sessions
                # (autogroup), a client in the endpoint's session takes part of the endpoint's
                # share; served apart, as a server's clients are (``main`` ends it with its parent)
                start_new_session=True,
            )  # fmt: skip
            HELPERS.add(self.proc.pid)  # (its CPU is the doctor's client's, not a neighbour's)
            if self._line(START_S) != READY:
                raise ValueError("the helper did not say it was ready")
        except (OSError, ValueError) as exc:
            self._broke(exc)
        return not self.broken

    def run(
        self, url: str, method: str, body: bytes, content_type: str | None, *, concurrency: int, requests: int, timeout_s: float, max_seconds: float
    ) -> tuple[list[Row], float] | None:
        """The block's requests as rows, and its wall time; None when no helper could run it
        (the caller measures in-process instead)."""
        if not self.start():
            return None
        job = {"url": url, "method": method, "body": base64.b64encode(body).decode(), "content_type": content_type,
               "concurrency": concurrency, "requests": requests, "timeout_s": timeout_s, "max_seconds": max_seconds}  # fmt: skip
        reply = self._ask(job, max_seconds + timeout_s + 10.0)
        return ([Row(*r) for r in reply["results"]], reply["elapsed"]) if reply is not None else None

    def one_by_one(
        self, host: str, port: int, method: str, path: str, body: bytes, headers: list[dict[str, str]], timeout_s: float, max_seconds: float
    ) -> list[Sent] | None:
        """A request for each of ``headers``, one after another, sent from the helper with
        their answers; the next starts only while ``max_seconds`` have not passed, and none
        after one that timed out. None when the helper broke (the caller sends them itself)."""
        job = {"one_by_one": [host, port, method, path, base64.b64encode(body).decode(), headers, timeout_s, max_seconds]}
        reply = self._ask(job, max_seconds + timeout_s + 10.0)
        if reply is None:
            return None
        return [Sent(g[0], g[1], g[2], base64.b64decode(g[3]) if g[3] is not None else None, g[4], g[5]) for g in reply["sent"]]

    def _ask(self, job: dict[str, Any], wait: float) -> dict[str, Any] | None:
        """The helper's reply to ``job`` within ``wait`` seconds; None once it broke (said in ``broken``)."""
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
            return json.loads(self._line(wait))
        except (OSError, ValueError) as exc:
            self._broke(exc)
            return None

    def _line(self, wait: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], wait)[0]:
            raise OSError(f"no answer within {wait:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise OSError(f"the helper ended (exit code {self.proc.poll()})")
        return line

    def _broke(self, exc: Exception) -> None:
        self.close(keep_stderr=True)
        said = []
        if self._stderr is not None:
            self._stderr.seek(0)
            said = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            self._stderr.close()
            self._stderr = None
        self.broken = f"{type(exc).__name__}: {exc}" + (f" (it said: {said[-1][:200]})" if said else "")

    def close(self, keep_stderr: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            retire_helper(proc.pid)
            try:
                if proc.stdin is not None:
                    proc.stdin.close()  # (its loop ends at the end of its input)
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None and not keep_stderr:
            self._stderr.close()
            self._stderr = None


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
    results, elapsed = closed_loop_block(
        job["url"], job["method"], base64.b64decode(job["body"]), job["content_type"], concurrency=job["concurrency"],
        requests=job["requests"], timeout_s=job["timeout_s"], max_seconds=job["max_seconds"],
    )  # fmt: skip
    return {"results": rows_of(results), "elapsed": elapsed}


def _one_by_one(args: list[Any]) -> dict[str, Any]:
    host, port, method, path, body, headers, timeout_s, max_seconds = args
    sents = send_in_turn(host, port, method, path, base64.b64decode(body), headers, timeout_s, max_seconds)
    return {"sent": [[*s[:3], base64.b64encode(s.data).decode() if s.data is not None else None, *s[4:]] for s in sents]}


def _end_with(parent: int) -> None:
    """Ends this process once ``parent`` has (killed with its session, this one is not in it)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> None:
    from ...load import loadgen  # noqa: F401  (imported before it says it is ready)

    threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True, name="servescope-orphan-watch").start()

    sys.stdout.write(READY.decode())
    sys.stdout.flush()
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.write(json.dumps(_one_by_one(job["one_by_one"]) if "one_by_one" in job else _block(job)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
