"""``servescope doctor --pid PID``: a running server diagnosed from outside, without touching it.

py-spy samples every thread of the process and of its workers (spy.py); the stacks are replayed
as spans (trace.py), each put in a stage by its frames (stages.py), and read for requests, the
event loop's busy runs, loads and hot lines (requests.py). Two modes:

- passive (no ``--url``): the server's own traffic, for ``--duration``;
- active (``--url``): the doctor's sequential requests, a gap between each so the samples tell
  them apart, then its concurrent ones, both sampled; latencies are the client's own.

What the rules read comes as the same Evidence as the in-process doctor's, ``target_kind``
"pid": the causes stacks show (loads per request, the loop blocked, slow stages with their hot
lines) are checked; what needs the process's objects (grad, training mode, batch sizes,
devices, thread pools) is listed as not checked, with why.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...environment import CpuReading
from ...exceptions import ConfigError
from ...recorder import Recorder
from ...report import Report
from ...sections import Diagnosis, Unattributed, Verdict
from ..evidence import Concurrent, Evidence, Forwards, LoopActivity, Machine, Warm
from ..options import DoctorOptions
from .flame import write_flames
from .requests import Samples, analyse
from .cpu import ProcessCpu, gil_busy_share
from .spy import RATE, AttachError, Recording, check_target, worker_pids
from .trace import Thread, threads_of

__all__ = ["AttachError", "LiveOptions", "diagnose_pid"]

#: Sequential requests that last this many sample intervals are timed one by one: each is
#: followed by a pause of ``GAP_SAMPLES`` intervals in which no thread works on a request, so
#: the samples tell it from the next. Shorter ones run back to back until they have kept the
#: server busy ``MIN_BUSY_S`` (about 300 samples at 100 Hz): their stages are means.
PACED_SAMPLES, GAP_SAMPLES, MIN_BUSY_S = 8, 3, 3.0
#: A load seen in this share of the run's tenths, taking this share of the p50, recurs on
#: every request (its calls may be too short to count).
RECUR_SPREAD, RECUR_SHARE = 0.8, 0.05
#: A share of the request outside the samples at least this large is said (as the in-process doctor's)
UNATTRIBUTED_SHARE = 0.3
#: Passive sampling tells requests apart when the server was idle between them: at most this
#: share of the run busy, and at least ``MIN_TOLD_APART`` requests seen.
PASSIVE_BUSY_MAX, MIN_TOLD_APART = 0.6, 3
#: Requests sent before sampling starts, per worker process.
WARMUP_PER_WORKER = 2
_NOT_SEEN = "not visible in a live process's stacks (doctor --pid)"


@dataclass
class LiveOptions:
    """What ``doctor --pid`` samples: the process, for how long (passive) or while sending to
    ``url`` (active), how often, and where its flame graphs go."""

    pid: int
    url: str | None = None
    duration_s: float = 30.0
    rate: int = RATE
    flames: str | None = None
    #: more processes that serve the same endpoint but are not ``pid``'s children (Ray Serve
    #: replicas, workers started by a supervisor): each is sampled with its own children
    more: tuple[int, ...] = ()

    @property
    def roots(self) -> list[int]:
        return list(dict.fromkeys([self.pid, *self.more]))

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ConfigError(f"--duration must be above 0, got {self.duration_s:g}")
        if not 1 <= self.rate <= 1000:
            raise ConfigError(f"--rate must be 1-1000 samples a second, got {self.rate}")


def _gone(pid: int) -> bool:
    """The process ended (a zombie its parent has not reaped yet has ended too)."""
    if not os.path.isdir("/proc"):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@dataclass
class Phase:
    """One sampled phase: every thread's stacks, the GIL's holders, the CPU the processes used."""

    threads: list[Thread]
    result: Any
    seconds: float
    gil: dict[int, float]  # pid -> share of the phase one of its threads held the GIL
    cores_busy: float | None
    cores_waiting: float | None
    threads_busy: int | None  # threads (native ones too) that used a tenth of a core or more
    held: list[Thread]  # the threads recorded holding the GIL, on the same clock


def _check_alive(live: LiveOptions) -> None:
    gone = [root for root in live.roots if _gone(root)]
    if gone:
        raise AttachError(f"process {gone[0]} ended during the run: nothing to diagnose (its samples were dropped)")


def _record(live: LiveOptions, pids: list[int], during: Callable[[], Any]) -> Phase:
    """Sample the process while ``during()`` runs (a second py-spy notes who holds the GIL)."""
    cpu = ProcessCpu(pids)
    recs = [Recording(root, live.rate, gil=gil).start() for root in live.roots for gil in (False, True)]
    t0 = time.perf_counter()
    try:
        result = during()
    finally:
        seconds = time.perf_counter() - t0
        try:
            events = [(rec, rec.stop()) for rec in recs]
        except AttachError:
            _check_alive(live)
            raise
    _check_alive(live)
    busy, waiting, threads = cpu.since()
    # (each recording's times count from its own start: put them on the first one's clock)
    stacks = [t for rec, ev in events if not rec.gil for t in threads_of(ev, rec.offset_us(recs[0]))]
    held = [t for rec, ev in events if rec.gil for t in threads_of(ev, rec.offset_us(recs[0]))]
    return Phase(stacks, result, seconds, gil_busy_share(held, seconds), busy, waiting, threads, held)


def diagnose_pid(
    live: LiveOptions, *, payload: Any = None, options: DoctorOptions | None = None, progress: Callable[[str], None] = lambda s: None
) -> Report:
    """Sample the running process (and its workers) and diagnose it from its stacks. Raises
    ``AttachError`` (nothing touched) when it cannot be sampled or ends during the run."""
    options = options or DoctorOptions()
    progress(f"attaching to process {live.pid}")
    seen = [check_target(root) for root in live.roots]
    workers = [w for root in live.roots for w in worker_pids(root)]
    pids = [*live.roots, *workers]
    started = time.perf_counter()
    cpu, target_cpu = CpuReading(), ProcessCpu(pids)
    if live.url:
        from .active import concurrent_phase, sequential_phase

        url = live.url
        progress("first requests (not sampled: a worker's first request may import lazily)")
        first = sequential_phase(url, payload, options, requests=WARMUP_PER_WORKER * max(len(workers), 1), budget_s=options.timeout_s)
        interval_ms = 1000 / live.rate
        # requests long enough to time one by one are sent apart; shorter ones back to back, until
        # the samples are enough for their stages' means
        paced = bool(first.latencies) and min(first.latencies) >= PACED_SAMPLES * interval_ms  # (the quickest: a worker's first may import)
        pace, busy = (GAP_SAMPLES * interval_ms / 1000, 0.0) if paced else (0.0, MIN_BUSY_S)
        progress("sequential requests, sampled")
        first_phase = _record(live, pids, lambda: sequential_phase(url, payload, options, requests=options.requests, pace_s=pace, busy_s=busy))
        seq = first_phase.result
        seq.paced = paced
        progress("concurrent requests, sampled")
        conc_phase = _record(live, pids, lambda: concurrent_phase(url, payload, options))
        conc = conc_phase.result
    else:
        progress(f"sampling the server's own traffic for {live.duration_s:g} s")
        first_phase = conc_phase = _record(live, pids, lambda: _wait(live))
        seq = conc = None
    seq_threads = first_phase.threads
    conc_threads = conc_phase.threads if conc_phase is not first_phase else []
    machine = Machine(cpus_available=_cpus_of(live.pid))
    machine.cores_idle, others, machine.cpu_pressure = cpu.since()
    served, _, _ = target_cpu.since()  # (the server is another process: its CPU is not the others')
    machine.others_cores = round(max(others - (served or 0.0), 0.0), 2) if others is not None else None
    samples = analyse(seq_threads, gil=first_phase.held)
    conc_samples = analyse(conc_threads, gil=conc_phase.held) if conc_threads else samples
    report = _report(live, samples, seq, options)
    report.meta["live"] = {
        "pid": live.pid, "pids": live.roots, "workers": workers, "threads_at_attach": sum(seen), "rate_hz": live.rate,
        "mode": "active" if live.url else "passive", "seconds_sampled": samples.seconds + (conc_samples.seconds if conc_threads else 0.0),
        "requests_told_apart": len(samples.requests), "timed_one_by_one": bool(seq is not None and seq.paced),
        "stage_ms_sampled": samples.stage_ms, "load_spread": samples.load_spread, "busy_fraction": samples.busy_fraction,
        "per_request": bool(live.url) or told_apart(samples), "top_lines": samples.top_lines,
        "cpu": {"cores_busy": conc_phase.cores_busy, "cores_waiting": conc_phase.cores_waiting, "threads_busy": conc_phase.threads_busy},
    }  # fmt: skip
    outside = (report.stages.get("outside the samples") or {}).get("share") or 0.0
    if report.diagnosis is not None and outside >= UNATTRIBUTED_SHARE:
        report.diagnosis.unattributed = Unattributed(
            share=round(outside, 3),
            why="outside the sampled processes' Python (the network, a proxy in another process such as Ray Serve's, the "
            "server's C code, time between samples): the samples cannot say what it is, so no cause in it is named",
        )
    if report.diagnosis is not None and report.meta.get("diagnosed", True):
        ev = _evidence(live, samples, conc_samples, seq, conc, options, machine, time.perf_counter() - started)
        _outside(ev, conc_samples, conc_phase)
        report.diagnosis.evidence = ev.to_dict()
        from ...rules import diagnose_report

        report.findings = diagnose_report(report)
    if live.flames:
        report.meta["live"]["flames"] = write_flames(seq_threads + conc_threads, live.flames)
    return report


def _wait(live: LiveOptions) -> None:
    end = time.perf_counter() + live.duration_s
    while time.perf_counter() < end:
        if any(_gone(root) for root in live.roots):
            return
        time.sleep(min(0.2, max(end - time.perf_counter(), 0.0)))


def _cpus_of(pid: int) -> float | None:
    try:
        return float(len(os.sched_getaffinity(pid)))
    except (AttributeError, OSError):
        return None


def _stage_stats(samples: Samples, n: int, latency_mean: float, per_request: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Each stage's mean per request (its sampled time over ``n`` requests) and share of the
    mean latency; percentiles only from requests timed one by one (``per_request``)."""
    totals: dict[str, float] = {}
    for r in samples.requests:  # (the user's code split into pre- and postprocessing)
        for k, v in r.items():
            totals[k] = totals.get(k, 0.0) + v
    out: dict[str, dict[str, Any]] = {}
    for stage, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        mean = total / n
        row: dict[str, Any] = {"count": n, "mean_ms": round(mean, 4)}
        values = [r.get(stage, 0.0) for r in per_request]
        for q in (50, 90, 95, 99):
            row[f"p{q}_ms"] = round(float(np.percentile(values, q)), 4) if values else None
        row["max_ms"] = round(max(values), 4) if values else None
        row["share"] = round(mean / latency_mean, 4) if latency_mean > 0 else None
        out[stage] = row
    rest = latency_mean - sum(r["mean_ms"] for r in out.values())
    if latency_mean > 0 and rest > 0:
        out["outside the samples"] = {"count": n, "mean_ms": round(rest, 4), "p50_ms": None, "p90_ms": None, "p95_ms": None,
                                      "p99_ms": None, "max_ms": None, "share": round(rest / latency_mean, 4)}  # fmt: skip
    return out


def told_apart(samples: Samples) -> bool:
    """Passive: were the server's requests separate enough in time to be told apart?"""
    return len(samples.requests) >= MIN_TOLD_APART and samples.busy_fraction <= PASSIVE_BUSY_MAX


def _stage_shares(samples: Samples) -> dict[str, dict[str, Any]]:
    """Each stage's share of the time the server's threads spent in requests (summed over threads)."""
    total = sum(samples.stage_ms.values())
    none = dict.fromkeys(("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"))
    return {k: {"count": 0, **none, "share": round(v / total, 4)} for k, v in sorted(samples.stage_ms.items(), key=lambda kv: -kv[1])} if total else {}


def _report(live: LiveOptions, samples: Samples, seq: Any, options: DoctorOptions) -> Report:
    """The breakdown: each stage's sampled time per request, over the requests the client timed
    (active) or the ones the samples told apart (passive); when they could not be told apart,
    each stage's share of the server's time in requests, and no ms per request."""
    rec = Recorder()
    timed: list[dict[str, float]] = []
    if seq is not None:
        latencies = list(seq.latencies)
        timed = [stages for stages, _ in seq.match(samples)] if seq.paced else []
        timed = timed if len(timed) >= 0.8 * len(latencies) else []
    else:
        latencies = [(t1 - t0) / 1000 for t0, t1 in samples.bounds] if told_apart(samples) else []
    for latency in latencies:
        rec.record_durations({}, latency)
    who = ",".join(map(str, live.roots))
    title = f"servescope doctor --pid {who}" + (f" --url {live.url}" if live.url else "")
    report = rec.report(title=title, tool="servescope doctor", target=f"pid {who}", diagnosed=True)
    report.latency.pop("first_ms", None)  # (the server was warm before the doctor came)
    if latencies:
        report.stages = _stage_stats(samples, len(latencies), float(np.mean(latencies)), timed)
    else:
        report.stages = _stage_shares(samples)
    verdict = Verdict(failures=seq.errors_by_kind() if seq is not None else {})
    report.diagnosis = Diagnosis(verdict=verdict, endpoint_errors=sorted(set(seq.errors))[:5] if seq is not None else [])
    if seq is not None:
        sent = len(seq.latencies) + len(seq.errors)
        if len(seq.latencies) < max(3, 0.5 * sent):
            verdict.diagnosed = False
            verdict.reason = f"{sent - len(seq.latencies)} of {sent} requests failed; the first: {seq.errors[0] if seq.errors else 'no answer'}"
    elif not samples.requests:
        verdict.diagnosed = False
        verdict.reason = f"no request was seen in {samples.seconds:g} s of samples: send traffic while the doctor samples, or give --url"
    if not verdict.diagnosed:
        report.meta["diagnosed"] = False
    return report


def _outside(ev: Evidence, s: Samples, phase: Phase) -> None:
    """What the phase under load measured from outside the process: the GIL's use and threads
    in requests of its busiest process (each process has its own GIL), its CPU."""
    conc = ev.concurrent
    if conc is None or phase.seconds <= 0:
        return
    conc.cpu_cores_busy, conc.cpu_wait_cores, conc.threads_busy = phase.cores_busy, phase.cores_waiting, phase.threads_busy
    conc.worker_hot_spot = s.worker_hot_spot
    conc.processes = max(len(s.request_ms_by_pid), 1)  # (the processes that served: a master only forks)
    by_pid = phase.gil or dict.fromkeys(s.request_ms_by_pid, 0.0)  # (no sample held the GIL: it was free)
    if by_pid:
        pid = max(by_pid, key=lambda p: (by_pid[p], s.request_ms_by_pid.get(p, 0.0)))
        conc.gil_busy_share = by_pid[pid]
        conc.threads_in_requests = round(s.request_ms_by_pid.get(pid, 0.0) / 1000 / phase.seconds, 2)


def _loads_per_request(s: Samples, n: int, latencies: list[float]) -> float:
    """Loads counted (a run of load samples is one), or at least one per request when loads
    shorter than a sample interval recur all through the run and take a share of each request
    (of the server's time in requests, when the requests could not be told apart)."""
    counted = s.calls.get("load", 0) / n if latencies else 0.0
    if latencies:
        share = s.stage_ms.get("load", 0.0) / n / float(np.median(latencies))
    else:
        share = s.stage_ms.get("load", 0.0) / max(sum(s.stage_ms.values()), 1e-9)
    if s.load_spread >= RECUR_SPREAD and share >= RECUR_SHARE:
        counted = max(counted, 1.0)
    return round(counted, 3)


def _evidence(live: LiveOptions, s: Samples, c: Samples, seq: Any, conc: Any, options: DoctorOptions, machine: Machine, seconds: float) -> Evidence:
    per_request = seq is not None or told_apart(s)
    n = max(len(seq.latencies) if seq is not None else len(s.requests), 1)
    lat = seq.latencies if seq is not None else [(t1 - t0) / 1000 for t0, t1 in s.bounds] if per_request else []
    warm = Warm(
        requests=n if per_request else 0,
        errors=len(seq.errors) if seq is not None else 0,
        p50_ms=round(float(np.percentile(lat, 50)), 3) if lat else None,
        p90_ms=round(float(np.percentile(lat, 90)), 3) if lat else None,
        max_ms=round(max(lat), 3) if lat else None,
        loads_per_request=_loads_per_request(s, n, lat),
        load_ms_per_request=round(s.stage_ms.get("load", 0.0) / n, 3) if per_request else None,
        load_calls=s.load_calls,
        forwards=Forwards(count=s.calls.get("infer", 0), per_request=round(s.calls.get("infer", 0) / n, 3) if per_request else 0.0,
                          on_event_loop=s.loop_infer_calls),  # fmt: skip
    )
    loop = None
    if c.loop_ms > 0:
        loop = LoopActivity(
            samples=int(c.loop_ms),  # (ms of the loop's thread sampled)
            busy_samples=int(c.loop_busy_ms),
            busy_share=round(c.loop_busy_ms / c.loop_ms, 3),
            longest_busy_ms=c.loop_longest_ms,
            hot_spot=c.loop_hot_spot,
        )
    concurrent = Concurrent(
        concurrency=options.concurrency if conc is not None else 0,
        requests=conc.requests if conc is not None else 0,
        errors=conc.errors if conc is not None else 0,
        throughput_rps=conc.rps if conc is not None else None,
        sequential_rps=seq.rps if seq is not None else None,
        p50_ms=conc.p50_ms if conc is not None else None,
        # (a sampled call: the loop ran the model; counted as the in-process doctor counts forwards there)
        forwards=Forwards(count=c.calls.get("infer", 0), on_event_loop=c.loop_infer_calls) if conc is not None else None,
        loop=loop,
        # a busy run on the loop is how late every other task on it woke (the lag it caused)
        loop_lag_max_ms=c.loop_longest_ms if loop is not None else None,
    )
    missing = {
        "cold": "the server was already running: its first request came before the doctor attached "
        "(run `servescope doctor FILE:app` to see a cold start)",
        "batch_probe": "the model cannot be called from outside the process (doctor --pid)",
        "repeated": "the model's inputs are " + _NOT_SEEN,
        "environment": "the process's devices and the sizes of its thread pools (torch, ONNX Runtime, BLAS) are " + _NOT_SEEN,
    }
    return Evidence(
        target_kind="pid",
        warm=warm,
        concurrent=concurrent,
        hot_spots=s.hot_spots,
        hot_spots_in_user_code=s.hot_in_user_code,
        seconds=round(seconds, 2),
        missing=missing,
        machine=machine,
        scaling=round(conc.rps / seq.rps, 2) if conc is not None and seq is not None and conc.rps and seq.rps else None,
    )
