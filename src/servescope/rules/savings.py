"""A finding's saving: measured by trying the fix on the endpoint when the doctor could
(``Evidence.experiments``), estimated otherwise, and always at a stated load.

    saving = measured_or_estimated(ev, "memoise-loaders", estimate_ms=12.0, estimated_from="the load calls' own time")
    Finding(..., saving_ms=saving.ms, detail=saving.detail, **saving.fields())
"""

from __future__ import annotations

from dataclasses import dataclass

from ..doctor.evidence import Evidence, MissingEvidence, WhatIf

__all__ = ["BUSY_CORES", "SPEED_MOVED", "Saving", "fresh_gain", "measured_or_estimated", "severity"]

#: Other processes using this many cores or more make the machine busy (doctor/run.py).
BUSY_CORES = 0.5
#: the unchanged endpoint's p50 in an experiment's blocks and on its own further apart than
#: this factor: the machine's speed moved, and the saving in ms is said to hold at the blocks'
SPEED_MOVED = 1.5
#: a fix whose blocks served this many times the requests a second is not said to make nothing faster
THROUGHPUT_GAIN = 1.1


def severity(saving_ms: float, p50_ms: float) -> str:
    """How bad, from the share of the request's p50 the fix would save."""
    share = saving_ms / p50_ms if p50_ms > 0 else 0.0
    if share >= 0.5:
        return "critical"
    if share >= 0.2:
        return "high"
    if share >= 0.05:
        return "medium"
    if share >= 0.01:
        return "low"
    return "info"


@dataclass
class Saving:
    ms: float | None
    basis: str  # "measured" or "estimated"
    load: str  # "c=1", "c=8", "first request"
    detail: str
    low_ms: float | None = None
    high_ms: float | None = None
    coverage: float | None = None
    #: the p50 the saving is a share of (the unchanged endpoint's, at that load)
    p50_ms: float = 0.0

    def fields(self) -> dict[str, object]:
        if self.ms is None:
            return {}
        return {"saving_basis": self.basis, "saving_low_ms": self.low_ms, "saving_high_ms": self.high_ms,
                "saving_coverage": self.coverage, "saving_load": self.load,
                "saving_share": round(self.ms / self.p50_ms, 4) if self.p50_ms > 0 else None}  # fmt: skip

    def severity(self) -> str:
        """From the share of the p50 the fix saves; a measured saving from the low end of its
        interval (a saving that may be zero is not one to bank on)."""
        ms = self.ms or 0.0
        if self.basis == "measured" and self.low_ms is not None:
            ms = min(ms, max(self.low_ms, 0.0))
        return severity(ms, self.p50_ms)


def _ms(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def measured_or_estimated(
    ev: Evidence,
    experiment: str,
    *,
    estimate_ms: float | None,
    estimated_from: str,
    load: str = "c=1",
    p50_ms: float | None = None,
) -> Saving:
    """The experiment's measured saving when it ran to the end; else the estimate, saying
    from what it was made and why the fix was not tried."""
    w = ev.tried(experiment)
    base = p50_ms if p50_ms is not None else ev.p50_ms
    if w is not None:
        return _measured(w, experiment, endpoint_p50_ms=base)
    why = ""
    failed = ev.experiments.get(experiment)
    if failed is not None and failed.why_not:
        why = f" The fix was not tried on the endpoint: {failed.why_not}."
    text = f"Estimated from {estimated_from}, at {load}.{why}" if estimate_ms else why.strip()
    return Saving(ms=estimate_ms, basis="estimated", load=load, detail=text, p50_ms=base or 0.0)


def _speed_moved(w: WhatIf, endpoint_p50_ms: float | None) -> str:
    """What to say when the unchanged endpoint ran at another speed in the experiment's blocks
    than when the doctor measured it on its own (a busy machine whose speed swings): the
    difference holds for the blocks, not for every moment; the share travels better."""
    base = w.base_p50_ms or 0.0
    if w.measure == "first chunk" or not endpoint_p50_ms or base <= 0:
        return ""
    ratio = endpoint_p50_ms / base
    if 1 / SPEED_MOVED <= ratio <= SPEED_MOVED:
        return ""
    share = max(w.saving_ms or 0.0, 0.0) / base
    return (
        f" The unchanged endpoint ran at p50 {_ms(base)} ms in these blocks but {_ms(endpoint_p50_ms)} ms when measured on its own "
        f"({ratio:.1f}x): the machine's speed moved between them, so this saving in ms holds at the blocks' speed. As a share "
        f"it is {share:.0%} of the request: about {_ms(share * endpoint_p50_ms)} ms at the other speed."
    )


#: what a WhatIf's p50s and saving are of, by its ``measure``
MEASURES = {
    "latency": "p50",
    "first chunk": "p50 time to first chunk",
    "mean": "mean time a request spends (its callers over the throughput, as a steady load keeps it)",
}


def _measured(w: WhatIf, experiment: str, endpoint_p50_ms: float | None = None) -> Saving:
    load = f"c={w.concurrency}" + (", first chunk" if w.measure == "first chunk" else "")
    saving = max(w.saving_ms or 0.0, 0.0)
    level = f"{w.coverage:.0%}" if w.coverage is not None else "95%"
    interval = f" ({level} interval {_ms(w.low_ms)} to {_ms(w.high_ms)} ms)" if w.low_ms is not None and w.high_ms is not None else ""
    rate = ""
    if w.base_rps and w.fixed_rps:
        rate = f"; throughput {w.base_rps:g} -> {w.fixed_rps:g} req/s ({w.fixed_rps / w.base_rps:.2f}x)"
    what = MEASURES.get(w.measure, "p50")
    gain = (
        f"{_ms(w.saving_ms or 0.0)} ms per request{interval}"
        if (w.saving_ms or 0.0) > 0
        else f"no gain ({_ms(w.saving_ms or 0.0)} ms per request{interval}): " + (
            # (at c=N a fix may serve more requests a second and still not lower the median wait)
            f"the fix does not lower the {what} here, though it served {w.fixed_rps / w.base_rps:.2f}x the requests a second"
            if w.base_rps and w.fixed_rps and w.fixed_rps >= THROUGHPUT_GAIN * w.base_rps
            else "the fix does not make this endpoint faster here"
        )
    )
    busy = ""
    moved = _speed_moved(w, endpoint_p50_ms)
    if w.others_cores is not None and w.others_cores >= BUSY_CORES:
        busy = f" Other processes kept {w.others_cores:.1f} cores busy meanwhile" + (
            "." if moved else ": both arms ran beside them, and since their blocks alternated, the difference holds."
        )
    busy += moved
    if w.low_ms is not None and w.low_ms <= 0 < (w.saving_ms or 0.0):
        busy += " The interval includes zero: this saving cannot be told from none."
    detail = (
        f"Measured by trying the fix on this endpoint ({w.fix}): {what} {_ms(w.base_p50_ms or 0.0)} -> {_ms(w.fixed_p50_ms or 0.0)} ms "
        f"at {load}{rate}; saving {gain}, from {w.pairs} pairs of request blocks; answers {w.answers or 'not compared'}.{busy}"
    )
    return Saving(ms=round(saving, 3), basis="measured", load=load, detail=detail, low_ms=w.low_ms, high_ms=w.high_ms,
                  coverage=w.coverage, p50_ms=w.base_p50_ms or 0.0)  # fmt: skip


def alone_and_together(ev: Evidence, first_chunk: bool = False) -> tuple[float | None, float | None, str]:
    """One request alone and ``concurrency`` at once (p50s, to the first chunk where
    ``first_chunk``), measured alike: both in the run without the probes where both finished
    there, else both in the probed phases (which run slower, up to 38% at one client and 30%
    at c=8 here), never one of each. The third item says which, for a finding's words."""
    conc, warm = ev.concurrent, ev.warm
    if conc is None:
        return None, None, ""
    if first_chunk:
        served = conc.served_alone_first_chunk_p50_ms, conc.served_first_chunk_p50_ms
        probed = (warm.first_chunk_p50_ms if warm is not None else None), conc.first_chunk_p50_ms
    else:
        served, probed = (conc.served_alone_p50_ms, conc.served_p50_ms), (ev.p50_ms or None, conc.p50_ms)
    if served[0] and served[1]:
        return served[0], served[1], "without the probes"
    return probed[0], probed[1], "under the probes"


def rates(ev: Evidence) -> tuple[float | None, float | None, str]:
    """Requests a second from one caller and from ``concurrency`` callers, measured alike (as
    ``alone_and_together``), and which runs they come from."""
    conc = ev.concurrent
    if conc is None:
        return None, None, ""
    if conc.served_alone_rps and conc.served_rps:
        return conc.served_alone_rps, conc.served_rps, "without the probes"
    return conc.sequential_rps, conc.throughput_rps, "under the probes"


def p50_at_loads(ev: Evidence) -> dict[str, float]:
    """The p50 at each load a saving is stated at, as a server shows it: at c=N the concurrent
    load run again without the probes, else the experiments' blocks of the endpoint as
    written, else the probed phase."""
    p50_at = {"c=1": ev.p50_ms}
    conc = ev.concurrent
    if conc is not None and conc.p50_ms:
        p50_at[f"c={conc.concurrency}"] = conc.served_p50_ms or _served_p50(ev, conc.concurrency, "latency") or conc.p50_ms
    if conc is not None and conc.first_chunk_p50_ms:  # a streamed answer's, measured to its first chunk
        p50_at[f"c={conc.concurrency}, first chunk"] = (
            conc.served_first_chunk_p50_ms or _served_p50(ev, conc.concurrency, "first chunk") or conc.first_chunk_p50_ms
        )
    return p50_at


def _served_p50(ev: Evidence, concurrency: int, measure: str) -> float | None:
    """The endpoint's p50 at ``concurrency`` as the experiments' blocks of it as written measured
    it (the median of theirs), or None where none ran there: where the concurrent load was not
    run again without the probes (``Concurrent.served_p50_ms``), these blocks, also unprobed
    and their load sent from a helper process, are the next best thing to a server's figure.
    The concurrent phase, probed and sampled, ran about 30% slower on a quiet machine
    (docs/benchmarks.md, sessions 21 and 22), and savings capped against it could add up to
    more than a server's request."""
    bases = sorted(
        w.base_p50_ms for w in ev.experiments.values() if w.tried and w.concurrency == concurrency and w.measure == measure and w.base_p50_ms
    )  # fmt: skip
    return bases[len(bases) // 2] if bases else None


def fresh_gain(ev: Evidence, experiment: str, share: float, *, cause: str, untried: str) -> WhatIf | None:
    """The setting ``experiment`` tried in fresh processes (doctor/fresh.py), where it gained
    enough to name its cause: ``share`` of the process as written's p50 or more, its interval
    above zero at 90% or more (two processes of one endpoint differ a little by their history
    alone); None where it gained less. Not tried: ``MissingEvidence`` saying ``cause`` and why
    (the run's reason, else ``untried``)."""
    from ..doctor.experiments.lab import INTERVAL_COVERAGE

    w = ev.experiments.get(experiment)
    if w is None or not w.tried or w.saving_ms is None:
        raise MissingEvidence(f"{cause}: {w.why_not if w is not None and w.why_not else untried}")
    if (w.low_ms or 0.0) <= 0 or (w.coverage or 0.0) < INTERVAL_COVERAGE or w.saving_ms < share * (w.base_p50_ms or 0.0):
        return None
    return w

