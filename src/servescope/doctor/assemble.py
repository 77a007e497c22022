"""A doctor's run, assembled: the evidence it measured, typed, and the report built from it.

    evidence = evidence_of(run)        # for the experiments, then the rules
    report = report_of(run, "app.py:app")

``run`` is the ``_Run`` of doctor/run.py once its phases are done (or while they go on: the
experiments read the evidence measured so far).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

from ..allocator import allocator, malloc_setting
from ..environment import available_cpus
from ..openmp import openmp_loaded, wait_policy_set
from ..recorder import Recorder
from ..report import Report
from ..sections import Diagnosis, Unattributed
from .attribution import split_other, stage_windows
from .endpoints import Observation
from .evidence import Cold, Concurrent, Environment, Evidence, Forwards
from .summary import blas_threads, chunk_gaps, first_chunk_p50, forwards_of

__all__ = ["evidence_of", "report_of"]

#: A share of the request outside every stage above which the report says it cannot tell.
UNATTRIBUTED_SHARE = 0.3
#: The unstaged time of a request with no model call is said to be in its hot spot only when
#: code was sampled running for at least this share of it
WORKING_SHARE = 0.5


def evidence_of(run: Any) -> Evidence:
    """What the run measured, typed: for the experiments, then the rules."""
    warm = run._warm_evidence()
    if "warm.forwards" in run.missing:
        warm.forwards = Forwards()
    ok_warm = [w for w in run.warm if w.error is None]
    o = run.options
    conc_ok = [c for c in run.conc if c.error is None]
    # from the median: one slow request (a collection, a late warm-up) must not halve it
    seq_rps = 1000 / statistics.median(w.latency_ms for w in ok_warm) if ok_warm else None

    lag = list(run.endpoint.loop_watch.lag_ms)
    torch = run.probes.torch
    concurrent = Concurrent(
        concurrency=o.concurrency,
        requests=len(run.conc),
        errors=sum(1 for c in run.conc if c.error),
        throughput_rps=round(len(conc_ok) / run.conc_elapsed, 2) if run.conc_elapsed else None,
        sequential_rps=round(seq_rps, 2) if seq_rps else None,
        p50_ms=round(float(np.percentile([c.latency_ms for c in conc_ok], 50)), 3) if conc_ok else None,
        first_chunk_p50_ms=first_chunk_p50(conc_ok),
        chunk_gap_p50_ms=chunk_gaps(conc_ok)[0],
        chunk_gap_p95_ms=chunk_gaps(conc_ok)[1],
        forwards=forwards_of(run.conc, skip=run.constant) if run.probes_at_fault is None else None,
        loop_lag_max_ms=round(max(lag), 3) if lag else None,
        loop_lag_p99_ms=round(float(np.percentile(lag, 99)), 3) if lag else None,
        background_calls=len(run.probes.background_forwards),
        background_batch_sizes=sorted({f["batch"] for f in run.probes.background_forwards if f.get("batch")}),
        **run.concurrent_extra,
        **run.served,
    )
    windows: dict[str, list[tuple[int, int]]] = {}
    for w in ok_warm:
        if w.trace is not None:
            for k, v in stage_windows(w.trace, w.evidence).items():
                windows.setdefault(k, []).extend(v)
    cold = run.cold or Observation(0.0)
    hot = run.sampler.hot_spots(windows)
    working = run.sampler.working_share(windows.get("other", []))
    if "other" in hot and working is not None and working < WORKING_SHARE:
        del hot["other"]  # (mostly waiting: I/O, a lock; what ran is not where the time went)
    again_ms, again_p50, again_error = run.repeated_cold or (None, None, None)
    cold_stages = split_other(cold.trace, cold.evidence) if cold.trace is not None else {}
    evidence = Evidence(
        target_kind=run.endpoint.kind,
        cold=Cold(
            latency_ms=round(cold.latency_ms, 3),
            error=cold.error,
            loads=cold.evidence.get("loads", 0),
            constructed=cold.evidence.get("constructed", 0),
            params_built=cold.evidence.get("params_built", 0),
            load_calls=[label for label, _ in cold.evidence.get("load_calls", [])],
            stage_ms={k: round(v, 3) for k, v in cold_stages.items()},
            repeat_ms=again_ms,
            repeat_p50_ms=again_p50,
            repeat_error=again_error or "",
        ),
        warm=warm,
        concurrent=concurrent,
        batch_probe=run.probe,
        repeated=run.repeated,
        environment=Environment(
            cuda_available=bool(torch is not None and torch.cuda.is_available()),
            torch_threads=torch.get_num_threads() if torch is not None else None,
            cpus_available=available_cpus(),
            workers=1,
            blas_threads=blas_threads(),
            ort_threads=max((n or (os.cpu_count() or 1) for n in run.probes.ort_threads), default=None),
            omp_wait_policy=(wait_policy_set() or "default") if openmp_loaded() else None,
            allocator=allocator(),
            malloc_setting=malloc_setting(),
        ),
        hot_spots=hot,
        hot_spots_in_user_code={k: run.sampler.is_user_code(v) for k, v in hot.items()},
        hot_lines={k: line for k, v in hot.items() if (line := run.sampler.line_of(v))},
        hot_spot_lines={k: lines for k, v in hot.items() if (lines := run.sampler.own_lines(v))},
        app_exceptions=run.exceptions.summaries(),
        seconds=round(time.perf_counter() - run.started + run.import_s, 2),
        missing=run.missing,
        probes_disabled=dict(run.probes.disabled),
        probes_at_fault=run.probes_at_fault,
        experiments=dict(run.experiments),
        machine=run.machine,
    )
    return evidence


def report_of(run: Any, target_name: str) -> Report:
    """The finished run's report: its requests' stages, its verdict, and where it could be
    diagnosed, the evidence and the findings the rules make of it."""
    rec = Recorder()
    is_http = run.endpoint.kind != "function"
    for w in run.warm:  # the cold request is reported on its own (first_ms), not in the statistics
        stages = split_other(w.trace, w.evidence) if w.trace is not None else {}
        if w.trace is not None and is_http:  # what the server did not see
            stages["network+client"] = max(w.latency_ms - (w.trace.total_ms or 0.0), 0.0)
        rec.record_durations(stages, w.latency_ms, error=w.error)
    report = rec.report(title=f"servescope doctor {target_name}".strip(), tool="servescope doctor", target=target_name, diagnosed=True)
    report.meta["request"] = run.send.describe(getattr(run.endpoint, "method", None))
    verdict = run.verdict()
    if run.cold is not None:
        report.latency["first_ms"] = round(run.cold.latency_ms, 4)
    failures = sorted({x.error for x in [run.cold, *run.warm, *run.conc] if x is not None and x.error})
    failures += [f"raised: {r}" for r in run.exceptions.summaries()]
    diagnosis = report.diagnosis = Diagnosis(
        verdict=verdict, endpoint_errors=failures[:5], probes_disabled=dict(run.probes.disabled)
    )
    if not verdict.diagnosed:
        report.meta["diagnosed"] = False
        return report
    evidence = run._evidence()
    diagnosis.evidence = evidence.to_dict()
    other = (report.stages.get("other") or {}).get("share") or 0.0
    if other >= UNATTRIBUTED_SHARE:
        diagnosis.unattributed = Unattributed(share=round(other, 3), where=evidence.hot_spots.get("other", ""))
    from ..rules import diagnose_report

    report.findings = diagnose_report(report)
    return report
