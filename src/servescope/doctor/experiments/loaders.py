"""Load once: every loader and model constructor the requests call answered from memory."""

from __future__ import annotations

from ..evidence import Evidence, Warm, WhatIf
from .lab import Fix, Lab
from .memo import Memo
from .seen import Seen

__all__ = ["memoise_loaders"]

#: Loads too small to measure by block pairs: under this share of the request ...
SMALL_OF_REQUEST = 0.05
#: ... and under this share of how far its time moves (p90 - p50 of the warm requests, or of
#: the blocks as written of the fixes tried before)
SMALL_OF_SPREAD = 0.25


def memoise_loaders(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or not (warm.loads_per_request >= 0.5 or (warm.constructed_per_request >= 1 and warm.params_built_per_request > 0)):
        return None
    words = "loaders and model constructors answered from memory (load once)"
    if (small := _too_small_to_measure(warm, lab.spread_ms())) is not None:
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
        )
    )


def _too_small_to_measure(warm: Warm, blocks_spread: float | None) -> str | None:
    """Why blocks of requests cannot measure these loads, or None: their own time (timed by the
    probes) is a few percent of a request whose time moves far more than that from one request
    to the next (the warm requests' p50 to p90), or from one block to the next in the fixes
    tried before (a busy machine), so a few pairs of blocks would give an interval around
    nothing, at a cost of seconds; the finding keeps the loads' own time as its estimate."""
    own = (warm.load_ms_per_request or 0.0) + (warm.construct_ms_per_request or 0.0)
    p50 = warm.p50_ms
    if not own or not p50:
        return None
    spread = max((warm.p90_ms or p50) - p50, blocks_spread or 0.0)
    if own >= SMALL_OF_REQUEST * p50 or own >= SMALL_OF_SPREAD * spread:
        return None
    return (
        f"the loads take {own:.3g} ms of a {p50:.0f} ms request, while the endpoint's own time moves by {spread:.0f} ms "
        f"(p50 to p90, of its requests or of its blocks as written): too small for pairs of request blocks to measure here"
    )
