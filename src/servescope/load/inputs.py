"""What a run sends: its bodies in order or sampled, and latency by the inputs' size.

    order = send_order(3, "random", seed=7)          # indices of the bodies, in the order sent
    buckets = size_buckets(results, sizes=[120, 4000, 90_000])   # load.by_size

The load generator cycles a list of pre-built requests; ``send_order`` is that list's order
(each pass over the bodies in a new seeded order for ``random``), and each ``Result`` says
which of the list it was (``Result.request``), so its input size is known after the run.
"""

from __future__ import annotations

import random
from typing import Literal

import numpy as np

from ..exceptions import ConfigError
from ..sections import SizeBucket
from ..stats import Distribution
from .wire import Result, error_kind, streamed

__all__ = ["MAX_BUCKETS", "ORDERS", "RANDOM_LENGTH", "Order", "send_order", "size_buckets"]

Order = Literal["cycle", "random"]
ORDERS = ("cycle", "random")
#: ``random``: passes over the bodies are drawn until the list holds at least this many
#: requests (then it is cycled), so a short file is still sent in a varied order.
RANDOM_LENGTH = 4096
#: ``load.by_size`` has at most this many buckets
MAX_BUCKETS = 4


def send_order(count: int, order: str, *, seed: int | None = None) -> list[int]:
    """The bodies' indices in the order they are sent (then cycled): as given for ``cycle``;
    for ``random``, pass after pass over all of them, each pass shuffled (seeded)."""
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == "cycle" or count < 2:
        return list(range(count))
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < RANDOM_LENGTH:
        one = list(range(count))
        rng.shuffle(one)
        out += one
    return out


def _ms(x: float) -> float:
    return round(float(x), 4)


def size_buckets(results: list[Result], sizes: list[int], *, unit: str = "bytes") -> list[SizeBucket]:
    """Latency (and TTFT, when streamed) by input size (``sizes[result.request]``): a bucket per
    size when the requests had at most four, else four cut at the quartiles of their sizes, so
    each holds about a quarter of them (a size on a cut belongs to the bucket below it; ties
    can leave fewer). Empty when every request had the same size (or none is known)."""
    known = [(sizes[r.request], r) for r in results if 0 <= r.request < len(sizes)]
    if len({s for s, _ in known}) < 2:
        return []
    arr = np.asarray([s for s, _ in known])
    cuts = np.unique(arr)
    if len(cuts) > MAX_BUCKETS:
        cuts = np.unique(np.percentile(arr, [25, 50, 75, 100], method="inverted_cdf"))
    which = np.searchsorted(cuts, arr, side="left")
    out = []
    for b in range(len(cuts)):
        members = [known[i] for i in np.flatnonzero(which == b)]
        if not members:
            continue
        latency, ttft = Distribution(), Distribution()
        errors = 0
        for _, r in members:
            if error_kind(r) is not None:
                errors += 1
                continue
            start = min(r.scheduled_ns, r.sent_ns)
            latency.add((r.done_ns - start) / 1e6)
            stream = r.stream
            if streamed(r) and stream[2]:
                ttft.add(max(stream[2][0] - start, 0) / 1e6)
        ok = len(latency) > 0
        any_streamed = len(ttft) > 0
        out.append(
            SizeBucket(
                smallest=min(s for s, _ in members), largest=max(s for s, _ in members), unit=unit,
                count=len(latency), errors=errors,
                p50_ms=_ms(latency.percentile(50)) if ok else None, p99_ms=_ms(latency.percentile(99)) if ok else None,
                ttft_p50_ms=_ms(ttft.percentile(50)) if any_streamed else None,
                ttft_p99_ms=_ms(ttft.percentile(99)) if any_streamed else None,
            )
        )  # fmt: skip
    return out
