"""Load once: every loader and model constructor the requests call answered from memory."""

from __future__ import annotations

from ..evidence import Evidence, WhatIf
from .lab import Fix, Lab
from .memo import Memo
from .seen import Seen

__all__ = ["memoise_loaders"]


def memoise_loaders(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or not (warm.loads_per_request >= 0.5 or (warm.constructed_per_request >= 1 and warm.params_built_per_request > 0)):
        return None
    memo = Memo(seen.model_types, seen.data_keys)
    return lab.compare(
        Fix(
            "memoise-loaders",
            "loaders and model constructors answered from memory (load once)",
            memo.apply,
            hits=memo.hits,
            release=memo.release,
            no_effect="no loader or constructor was called again with the same arguments",
        )
    )
