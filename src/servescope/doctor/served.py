"""The doctor's loads once more without the probes and the sampler, as a server runs them.

The probed phases run slower than a server (docs/benchmarks.md, session 22: an embedding
endpoint at c=8, 105 ms probed against 76-78 bare and 85-92 under uvicorn; up to 38% at one
client), so ``SERVED_ALONE`` requests one at a time run bare after the sequential phase
(before the concurrent burst, as that phase), and the concurrent phase's load (as many
requests) runs again bare after it, both from the helper process where the endpoint has one.
A rule that sets one caller against N reads both from here or both from the probed phases
(rules.savings.alone_and_together), never one of each.
"""

from __future__ import annotations

import time

import numpy as np

from .endpoints import UNFINISHED, Endpoint, untraced_load
from .options import MIN_OK_REQUESTS
from .summary import first_chunk_p50

__all__ = ["ALONE_MAX_S", "SERVED_ALONE", "unprobed_alone", "unprobed_concurrent"]

#: Requests one at a time in the run without the probes, within at most ``ALONE_MAX_S``
#: (at least ``MIN_OK_REQUESTS`` of them, or none is kept)
SERVED_ALONE, ALONE_MAX_S = 5, 8.0


def unprobed_alone(endpoint: Endpoint, body: bytes, *, timeout_s: float, budget_s: float) -> tuple[dict[str, float | None], dict[str, str]]:
    """(the evidence's ``served_alone_*`` fields, missing entries): ``SERVED_ALONE`` requests one
    at a time within about ``budget_s``, and the cores the process kept busy meanwhile (the
    client is the helper's where the endpoint has one, so it is not among them). Run before
    the concurrent burst, as the sequential phase is: on a busy machine a burst of concurrent
    calls can leave a torch process several times faster at one client for a while (OpenMP's
    threads), and one caller's figure from then is not the endpoint's."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    got, elapsed = untraced_load(endpoint, body, 1, SERVED_ALONE, timeout_s, budget_s)
    cores = (time.process_time() - cpu0) / max(time.perf_counter() - t0, 1e-9)
    alone = [c for c in got if c.error != UNFINISHED]  # (not sent: the budget ran out first)
    if len(alone) < MIN_OK_REQUESTS or elapsed <= 0 or any(c.error for c in alone):
        return {}, {"concurrent.served_alone": f"fewer than {MIN_OK_REQUESTS} requests one at a time without the probes finished cleanly within {budget_s:.0f} s"}
    p50 = float(np.percentile([c.latency_ms for c in alone], 50))
    return {
        "served_alone_p50_ms": round(p50, 3),
        "served_alone_first_chunk_p50_ms": first_chunk_p50(alone),
        "served_alone_rps": round(1000 / p50, 2) if p50 > 0 else None,  # (from the median, as sequential_rps)
        "served_alone_cores": round(cores, 2),
    }, {}


def unprobed_concurrent(
    endpoint: Endpoint, body: bytes, *, concurrency: int, requests: int, timeout_s: float, budget_s: float, load_from: str
) -> tuple[dict[str, float | None], dict[str, str]]:
    """(the evidence's ``served_*`` fields, missing entries): the concurrent phase's load again,
    ``requests`` at ``concurrency`` within about ``budget_s``. Nothing is kept from a load with a
    failed or unfinished request, or one sent from elsewhere than the probed phase's
    (``load_from``: a helper that broke meanwhile)."""
    obs, elapsed = untraced_load(endpoint, body, concurrency, requests, timeout_s, budget_s)
    if not obs or elapsed <= 0 or any(c.error for c in obs):
        return {}, {"concurrent.served": "the concurrent load without the probes did not finish cleanly within the time left"}
    if endpoint.load_from != load_from:
        return {}, {"concurrent.served": f"the loads without the probes came from {endpoint.load_from}, the concurrent phase's from {load_from}: not compared"}
    return {
        "served_p50_ms": round(float(np.percentile([c.latency_ms for c in obs], 50)), 3),
        "served_first_chunk_p50_ms": first_chunk_p50(obs),
        "served_rps": round(len(obs) / elapsed, 2),
    }, {}
