"""Streamed responses' figures: time to first byte and first token, the gaps between tokens.

    section, gaps = stream_stats(streams, open_loop=True, window_s=10.0)
    section.ttft["p50_ms"], section.itl["p99_ms"]

A *token* is a chunk of a chunked response, or a Server-Sent Event carrying ``data``, as the
load generator saw it arrive (``wire.Result.stream``). Every figure counts from the
request's start: the earlier of its scheduled and its actual send time, so in open loop a
server that stalls cannot hide the wait of requests due during the stall (coordinated
omission). Gaps between tokens need one more step in open loop: a stream that stalls for 1 s
between tokens that normally come every 20 ms yields one gap of 1 s where a user waiting
for tokens would see ~50 overdue ones, so each long gap also records the overdue tokens'
waits (``gap - k * expected`` down to ``expected``, as HdrHistogram's
``recordValueWithExpectedInterval`` and wrk2 do), the expected interval being the median
gap of the run. The headline ``itl`` is the gaps as observed, each once (vLLM's ITL, what a
server and the other tools report); the corrected gaps are ``itl_corrected``, beside it.
docs/bench.md defines each figure.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..sections import BURST_MS, Stream
from ..stats import Distribution
from .wire import SSE

__all__ = ["MIN_EXPECTED_MS", "Streamed", "overdue", "stream_stats"]

#: No correction when the median gap is below this (ms): tokens then come in bursts read
#: together, and there is no cadence for a stall to be measured against.
MIN_EXPECTED_MS = BURST_MS


class Streamed(NamedTuple):
    """One successful streamed response: its start (the earlier of scheduled and sent), its
    kind (``wire.CHUNKED`` or ``SSE``), when its head arrived, when each token arrived (ns)."""

    start_ns: int
    kind: int
    head_ns: int
    times_ns: list[int]


def overdue(gaps_ms: np.ndarray, expected_ms: float) -> np.ndarray:
    """The waits of tokens overdue during long gaps: for each gap ``g`` >= 2 * ``expected_ms``,
    ``g - expected_ms``, ``g - 2 * expected_ms`` ... down to ``expected_ms``."""
    if not expected_ms > 0 or gaps_ms.size == 0:
        return np.empty(0)
    m = np.maximum(np.floor(gaps_ms / expected_ms).astype(np.int64) - 1, 0)
    total = int(m.sum())
    if total == 0:
        return np.empty(0)
    idx = np.repeat(np.arange(gaps_ms.size), m)
    k = np.arange(total) - np.repeat(np.cumsum(m) - m, m) + 1
    return gaps_ms[idx] - k * expected_ms


def stream_stats(streams: list[Streamed], *, open_loop: bool, window_s: float) -> tuple[Stream, list[np.ndarray]]:
    """The ``Stream`` section for these responses, and each response's own gaps (ms; in open
    loop with its overdue tokens' waits added) for judging SLOs request by request."""
    ttfb, ttft, tpot = Distribution(), Distribution(), Distribution()
    raw: list[np.ndarray] = []
    chunks = 0
    kinds = set()
    for s in streams:
        kinds.add("sse" if s.kind == SSE else "chunked")
        ttfb.add(max(s.head_ns - s.start_ns, 0) / 1e6)
        n = len(s.times_ns)
        chunks += n
        if n:
            ttft.add(max(s.times_ns[0] - s.start_ns, 0) / 1e6)
        gaps = np.diff(np.asarray(s.times_ns, dtype=np.int64)) / 1e6 if n > 1 else np.empty(0)
        raw.append(gaps)
        if n > 1:
            tpot.add((s.times_ns[-1] - s.times_ns[0]) / 1e6 / (n - 1))
    observed = Distribution()
    every = np.concatenate(raw) if raw else np.empty(0)
    observed.extend(every)
    expected = None
    per_request = raw
    dists = {"ttfb": ttfb, "ttft": ttft, "itl": observed, "tpot": tpot}
    if open_loop and every.size:
        expected = float(np.median(every))
        if expected >= MIN_EXPECTED_MS:
            per_request = []
            for gaps in raw:
                extra = overdue(gaps, expected)
                per_request.append(np.concatenate([gaps, extra]) if extra.size else gaps)
            corrected = Distribution()  # each response's gaps with its overdue waits, in order (compare cuts it in time blocks)
            corrected.extend(np.concatenate(per_request) if per_request else np.empty(0))
            dists = {**dists, "itl_corrected": corrected}
    section = Stream.from_distributions(
        dists,
        kind="+".join(sorted(kinds)) or "chunked",
        responses=len(streams),
        chunks=chunks,
        chunks_per_s=round(chunks / window_s, 2) if window_s > 0 else None,
        itl_expected_ms=None if expected is None else round(expected, 4),
    )
    return section, per_request
