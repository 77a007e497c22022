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
    "trim-padding": trim_padding,
    "inference-mode": inference_mode,
    "eval-mode": eval_mode,
    "off-the-loop": off_the_loop,
    "batching": batch_calls,
    "torch-threads": fewer_threads,
    "ort-threads": fewer_ort_threads,
    "blas-threads": fewer_blas_threads,
}


def run_experiments(ev: Evidence, lab: Lab, seen: Seen) -> dict[str, WhatIf]:
    """Each experiment the evidence calls for, within the lab's budget. An experiment that
    raises is reported as not tried with the error: the doctor's bug must not hide the cause."""
    out: dict[str, WhatIf] = {}
    for name, experiment in EXPERIMENTS.items():
        try:
            result = experiment(ev, lab, seen)
        except Exception as exc:  # noqa: BLE001 - reported, never our crash
            result = WhatIf(fix=name, why_not=f"the experiment failed: {type(exc).__name__}: {exc}"[:300])
        if result is not None:
            out[name] = result
    return out


__all__ = ["Abandon", "EXPERIMENTS", "Experiment", "Fix", "Lab", "Seen", "run_experiments"]
