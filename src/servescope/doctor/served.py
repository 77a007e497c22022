"""The doctor's loads once more without the probes and the sampler, as a server runs them.

The probed phases run slower than a server (docs/benchmarks.md, session 22: an embedding
endpoint at c=8, 105 ms probed against 76-78 bare and 85-92 under uvicorn; up to 38% at one
client), so after them ``SERVED_ALONE`` requests one at a time, then the concurrent phase's
load (as many requests), run again bare, from the helper process where the endpoint has one.
A rule that sets one caller against N reads both from here or both from the probed phases
(rules.savings.alone_and_together), never one of each.
"""

from __future__ import annotations

import time

import numpy as np

from .endpoints import Endpoint, untraced_load
from .summary import first_chunk_p50

__all__ = ["SERVED_ALONE", "unprobed_loads"]

#: Requests one at a time in the run without the probes
SERVED_ALONE = 5


def unprobed_loads(
    endpoint: Endpoint, body: bytes, *, concurrency: int, requests: int, timeout_s: float, alone_s: float, concurrent_s: float, load_from: str
) -> tuple[dict[str, float | None], dict[str, str]]:
    """(the evidence's ``served_*`` fields, missing entries): ``SERVED_ALONE`` requests one at a
    time within about ``alone_s`` (none where it is 0), then ``requests`` at ``concurrency``
    within about ``concurrent_s``. Nothing is kept from a load with a failed or unfinished
    request, or one sent from elsewhere than the probed phase's (``load_from``: a helper that
    broke meanwhile)."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    alone, alone_elapsed = untraced_load(endpoint, body, 1, SERVED_ALONE, timeout_s, alone_s) if alone_s > 0 else ([], 0.0)
    cores = (time.process_time() - cpu0) / max(time.perf_counter() - t0, 1e-9)  # (the client is the helper's, not in it)
    obs, elapsed = untraced_load(endpoint, body, concurrency, requests, timeout_s, concurrent_s)
    if not obs or elapsed <= 0 or any(c.error for c in obs):
        return {}, {"concurrent.served": "the concurrent load without the probes did not finish cleanly within the time left"}
    if endpoint.load_from != load_from:
        return {}, {"concurrent.served": f"the loads without the probes came from {endpoint.load_from}, the concurrent phase's from {load_from}: not compared"}
    served: dict[str, float | None] = {
        "served_p50_ms": round(float(np.percentile([c.latency_ms for c in obs], 50)), 3),
        "served_first_chunk_p50_ms": first_chunk_p50(obs),
        "served_rps": round(len(obs) / elapsed, 2),
    }
    if alone_s <= 0:
        return served, {}
    if len(alone) < SERVED_ALONE or alone_elapsed <= 0 or any(c.error for c in alone):
        return served, {"concurrent.served_alone": "the requests one at a time without the probes did not finish cleanly within their time"}
    p50 = float(np.percentile([c.latency_ms for c in alone], 50))
    served.update(
        served_alone_p50_ms=round(p50, 3),
        served_alone_first_chunk_p50_ms=first_chunk_p50(alone),
        served_alone_rps=round(1000 / p50, 2) if p50 > 0 else None,  # (from the median, as sequential_rps)
        served_alone_cores=round(cores, 2),
    )
    return served, {}
