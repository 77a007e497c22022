"""What-if experiments: each fix the doctor can apply in-process, tried on the running
endpoint against the endpoint as written (lab.py), before the doctor names its saving.

One small function per fix, ``experiment(evidence, lab, seen) -> WhatIf | None`` (None: the
evidence gives it nothing to try), in one registry beside the rules'. What they measure goes
into the evidence (``Evidence.experiments``), typed, where the rules read it: a finding says
"measured by trying the fix" with the interval and the load, or "estimated" and from what.
"""

from __future__ import annotations

from typing import Callable

from ..evidence import Evidence, WhatIf
from .batching import batch_calls
from .forward import eval_mode, inference_mode, memoise_repeated, trim_padding
from .items import batch_items
from .lab import Abandon, Fix, Lab
from .loaders import memoise_loaders
from .loop import off_the_loop
from .seen import Seen
from .threads import fewer_blas_threads, fewer_ort_threads, fewer_threads

Experiment = Callable[[Evidence, Lab, Seen], "WhatIf | None"]

#: Every experiment by the fix it tries, in the order they run (the costliest fixes first).
EXPERIMENTS: dict[str, Experiment] = {
    "memoise-loaders": memoise_loaders,
    "memoise-repeated": memoise_repeated,
    "batch-items": batch_items,
    "trim-padding": trim_padding,
    "inference-mode": inference_mode,
    "eval-mode": eval_mode,
    "torch-threads": fewer_threads,
    "ort-threads": fewer_ort_threads,
    "blas-threads": fewer_blas_threads,
    "off-the-loop": off_the_loop,
    "batching": batch_calls,
}

#: The experiments whose lever is concurrency: they read the concurrent phase's evidence, so
#: they run after it. The others run at one client right after the sequential requests, in
#: the state those left the process in (a burst of concurrent calls can leave a process on a
#: busy machine several times faster or slower at one client for a while).
AT_CONCURRENCY = frozenset({"off-the-loop", "batching"})
PER_REQUEST = frozenset(EXPERIMENTS) - AT_CONCURRENCY


#: On a busy machine the thread counts come first: beside a neighbour they are the largest
#: saving as a rule, and the budget may not reach the last experiments.
BUSY_FIRST = ("torch-threads", "ort-threads", "blas-threads")


def run_experiments(
    ev: Evidence, lab: Lab, seen: Seen, names: frozenset[str] | None = None, *, busy: bool = False
) -> dict[str, WhatIf]:
    """Each experiment the evidence calls for (of ``names``, default all), within the lab's
    budget, in the registry's order (``BUSY_FIRST`` first when the machine is ``busy``). An
    experiment that raises is reported as not tried with the error: the doctor's bug must not
    hide the cause."""
    out: dict[str, WhatIf] = {}
    order = [*BUSY_FIRST, *(n for n in EXPERIMENTS if n not in BUSY_FIRST)] if busy else list(EXPERIMENTS)
    for name in order:
        experiment = EXPERIMENTS[name]
        if names is not None and name not in names:
            continue
        try:
            result = experiment(ev, lab, seen)
        except Exception as exc:  # noqa: BLE001 - reported, never our crash
            result = WhatIf(fix=name, why_not=f"the experiment failed: {type(exc).__name__}: {exc}"[:300])
        if result is not None:
            out[name] = result
    return out


__all__ = ["AT_CONCURRENCY", "Abandon", "BUSY_FIRST", "EXPERIMENTS", "Experiment", "Fix", "Lab", "PER_REQUEST", "Seen", "run_experiments"]
