"""A second first request, in a fresh process: a slow first request is one sample, and on a
busy machine one sample can be slow for reasons that have nothing to do with the endpoint.
Before the doctor claims a cold start that no load explains, it starts the endpoint again
in a new interpreter (no probes), sends one request and a few more, and sees whether the
first is slow again.

    first_ms, p50_ms, error = repeat_first_request("app.py:app", "payload.json", options)

Run as ``python -m servescope.doctor.cold JOB.json OUT.json`` by the doctor's own process.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .endpoints.main_thread import lend_main_thread
from .fresh import job_of, start_endpoint

__all__ = ["repeat_first_request"]

#: Requests after the first, for the fresh process's own p50.
WARM_AFTER = 5


def repeat_first_request(spec: str, payload_path: str | None, options: Any) -> tuple[float | None, float | None, str | None]:
    """(first request ms, p50 of the next ones, error) from the endpoint started afresh; the
    process is given ``START`` + a few timeouts and then ended."""
    with tempfile.TemporaryDirectory(prefix="servescope-cold-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps(job_of(spec, payload_path, options)))
        limit = 120.0 + options.timeout_s * (WARM_AFTER + 1)
        try:
            subprocess.run(
                [sys.executable, "-m", "servescope.doctor.cold", str(job), str(out)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=limit, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, None, f"the fresh process did not finish within {limit:g} s"
        if not out.exists():
            return None, None, "the fresh process ended without an answer"
        data = json.loads(out.read_text())
        return data.get("first_ms"), data.get("p50_ms"), data.get("error")


def main(argv: list[str]) -> None:
    lend_main_thread(lambda: _first_requests(json.loads(Path(argv[1]).read_text()), Path(argv[2])))


def _first_requests(job: dict[str, Any], out: Path) -> None:
    result: dict[str, Any] = {}
    try:
        endpoint, body = start_endpoint(job)
        first = endpoint.request(body, job["timeout_s"])
        if first.error:
            result["error"] = f"the first request failed: {first.error}"
        else:
            result["first_ms"] = round(first.latency_ms, 3)
            gc.collect()  # (the start-up's first full collection, before the requests timed: as the doctor's run does)
            after = [endpoint.request(body, job["timeout_s"]) for _ in range(WARM_AFTER)]
            ok = [o.latency_ms for o in after if o.error is None]
            result["p50_ms"] = round(statistics.median(ok), 3) if ok else None
    except BaseException as exc:  # noqa: B036 - whatever happens, the doctor hears of it
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        out.write_text(json.dumps(result))
    finally:
        os._exit(0)  # threads the endpoint left behind (its server on the main thread) must not hold the process up


if __name__ == "__main__":
    main(sys.argv)
