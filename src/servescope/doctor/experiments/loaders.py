"""Load once: every loader and model constructor the requests call answered from memory."""

from __future__ import annotations

from ..evidence import Evidence, Warm, WhatIf
from .lab import Fix, Lab
from .memo import Memo
from .seen import Seen

__all__ = ["memoise_loaders"]

#: Loads too small to measure by block pairs: under this share of the request, and under what
#: pairs of blocks could tell from none in the time a fix gets (``Lab.resolvable_ms``)
SMALL_OF_REQUEST = 0.05


def memoise_loaders(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or not (warm.loads_per_request >= 0.5 or (warm.constructed_per_request >= 1 and warm.params_built_per_request > 0)):
        return None
    words = "loaders and model constructors answered from memory (load once)"
    if (small := _too_small_to_measure(warm, lab)) is not None:
        return WhatIf(fix=words, why_not=small)
    memo = Memo(seen.model_types, seen.data_keys)
    return lab.compare(
        Fix(
            "memoise-loaders",
            words,
            memo.apply,
            hits=memo.hits,
            release=memo.release,
            no_effect="no loader or constructor was called again with the same arguments",
            release_each_block=True,
        )
    )


def _too_small_to_measure(warm: Warm, lab: Lab) -> str | None:
    """Why blocks of requests cannot measure these loads, or None: their own time (timed by the
    probes) is a few percent of a request whose time moves far more than that from one request
    to the next (the warm requests' p50 to p90), or from one block to the next in the fixes
    tried before (a busy machine), so the pairs of blocks the time allows would give an
    interval around nothing, at a cost of seconds; the finding keeps the loads' own time as
    its estimate."""
    own = (warm.load_ms_per_request or 0.0) + (warm.construct_ms_per_request or 0.0)
    p50 = warm.p50_ms
    if not own or not p50:
        return None
    resolvable = lab.resolvable_ms(p50, (warm.p90_ms or p50) - p50)
    if own >= SMALL_OF_REQUEST * p50 or own >= resolvable:
        return None
    return (
        f"the loads take {own:.3g} ms of a {p50:.0f} ms request, while pairs of request blocks could tell about "
        f"{resolvable:.0f} ms from none here (the time its requests and blocks move by, over the pairs the time "
        "allows): too small to measure"
    )
