"""A doctor run's steps in fresh processes of the endpoint, after its own has stopped: a second
first request (doctor/cold.py), where the first was slow with no load to explain it or where
the requests load a model, and settings read when a process starts, tried beside the endpoint
as written (doctor/fresh.py): OpenMP's wait policy, where a busy machine calls for it, and
glibc's malloc keeping freed memory, where the requests fault fresh memory in. Where a second
first request and a setting are due, the setting's process as written is the second first
request too: its first request runs alone and its blocks give its p50, so one process starts
where two did (beside a neighbour, an import and six requests of a 1-s endpoint: about 15 s).

    due = Due.of(run)           # the steps the run's evidence calls for
    due.expected_s(run, ev)     # their seconds: kept out of the experiments at concurrency
    run_fresh(run, due)         # once the run's own endpoint has stopped
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .cold import WARM_AFTER
from .evidence import Evidence, Warm
from .options import MIN_OK_REQUESTS

__all__ = ["FRESH_IMPORT_S", "Due", "loads_go_fresh", "run_fresh"]

#: a fresh process's import of the target, where the doctor did not time its own
FRESH_IMPORT_S = 5.0


def loads_go_fresh(run: Any, warm: Warm) -> bool:
    """Whether the requests' model loads send a fresh process of the endpoint: what a load
    costs may depend on the process (what its memory allocator kept of the buffers freed
    before), and that process's p50 says how far."""
    from ..rules.loads import loads_a_model

    return run.repeat_cold is not None and run.probes_at_fault is None and loads_a_model(warm)


def _cold_due(run: Any) -> bool:
    """A first request slow with no load to explain it is one sample: start the endpoint again
    and see whether its first request is slow again. A model loaded on every request sends one
    too (``loads_go_fresh``)."""
    cold, ok = run.cold, [w.latency_ms for w in run.warm if w.error is None]
    if run.repeat_cold is None or cold is None or cold.error or len(ok) < MIN_OK_REQUESTS:
        return False
    from ..rules.loads import first_request_slow, loaded_lazily

    warm = run._warm_evidence()
    if loads_go_fresh(run, warm):
        return True
    lazy = loaded_lazily(cold.evidence.get("loads", 0), cold.evidence.get("params_built", 0), warm)
    return not lazy and first_request_slow(cold.latency_ms, statistics.median(ok), max(ok))


def _env_trials(run: Any) -> bool:
    """Whether the run can try a setting in fresh processes at all."""
    o = run.options
    return not (run.try_environment is None or o.experiment_seconds <= 0 or run.probes_at_fault or not any(w.error is None for w in run.warm))


@dataclass
class Due:
    """Which fresh-process steps the run's evidence calls for: a second first request
    (``cold``), OpenMP's wait policy (``policy``: read when torch loads) and glibc's malloc
    keeping freed memory (``churn``: read when the process starts)."""

    cold: bool = False
    policy: bool = False
    churn: bool = False

    @classmethod
    def of(cls, run: Any, ev: Evidence | None = None) -> "Due":
        from .fresh import churn_called_for, passive_called_for

        if not _env_trials(run):
            return cls(cold=_cold_due(run))
        ev = ev if ev is not None else run._evidence()
        return cls(cold=_cold_due(run), policy=passive_called_for(ev), churn=churn_called_for(ev))

    @property
    def together(self) -> bool:
        """The second first request rides on the first setting tried: its process as written."""
        return self.cold and (self.policy or self.churn)

    def expected_s(self, run: Any, ev: Evidence) -> float:
        """What the fresh processes will take: the second first request's where the requests
        load a model (the target's import, then its six requests), and each setting tried (both
        processes' start, the blocks); the first with the second where both are."""
        p50_ms = (ev.warm.p50_ms or 0.0) if ev.warm is not None else 0.0
        expected = getattr(run.try_environment, "expected_s", None)
        firsts = [self.together] + [False] * (self.policy + self.churn - 1) if self.policy or self.churn else []
        settings = sum(expected(p50_ms, first_alone=first) for first in firsts) if expected is not None else 0.0
        repeat = 0.0
        if self.cold and not self.together and ev.warm is not None and loads_go_fresh(run, ev.warm):
            repeat = (run.import_s or FRESH_IMPORT_S) + (WARM_AFTER + 1) * p50_ms / 1000
        return repeat + settings


#: each setting a run may try in fresh processes: its experiment's name, what the run says it
#: is doing, and which ``Due`` flag calls for it
_SETTINGS = (("omp-passive", "OpenMP's wait policy", "policy"), ("keep-freed-memory", "glibc's malloc keeping freed memory", "churn"))


def run_fresh(run: Any, due: Due) -> None:
    """The steps ``due`` names, one after the other, each on a thread while the parent hears
    from the run (a fresh process starting can take a while); a step that raises leaves its
    result None. The first setting tried also times the second first request where both are
    due (alone, where that setting's processes gave no answer)."""
    from .fresh import try_keep_freed, try_wait_policy

    tries = {"omp-passive": try_wait_policy, "keep-freed-memory": try_keep_freed}
    carry_cold, carried = due.together, False
    for name, words, flag in _SETTINGS:
        if not getattr(due, flag):
            continue
        ev, trials, o, first = run._evidence(), run.try_environment, run.options, carry_cold
        carry_cold = False
        phase = ("a second first request and " if first else "") + f"{words}, in two fresh processes"

        def attempt(name: str = name, ev: Evidence = ev, first: bool = first) -> Any:
            return tries[name](ev, trials, o, **({"first_alone": True} if first else {}))

        w = _in_background(run, phase, attempt)
        if w is None:
            continue
        run.experiments[name] = w
        if first:
            carried = True
            run.repeated_cold = (w.base_first_ms, w.base_p50_ms if w.tried else None, None if w.base_first_ms is not None else w.why_not or "no answer")
    if due.cold and not carried:
        run.repeated_cold = _in_background(run, "a second first request, in a fresh process", run.repeat_cold)


def _in_background(run: Any, phase: str, work: Callable[[], Any]) -> Any:
    """``work()`` on a thread while the parent hears from the run; its result, None if it raised."""
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(work()), daemon=True, name="servescope-fresh")
    t.start()
    while t.is_alive():
        run.tick(phase, 0.5)
        t.join(1.0)
    return done[0] if done else None
