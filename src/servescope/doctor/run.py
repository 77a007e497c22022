"""The doctor's run: drive the endpoint through its phases under probes, keep the evidence,
and decide whether it can be diagnosed at all.

    report = diagnose(load_target("app.py:app"), payload={"text": "hi"})

Phases, each with a deadline (never longer than ``timeout_s``): start; one cold request;
sequential warm requests (the stage breakdown, under the sampler); a concurrent phase (does
it batch? is the event loop blocked? is the GIL? does it scale?); a model-only batch probe
that replays a captured model input at batch sizes 1..16 without the probes.

When the warm requests fail, there is nothing to diagnose: the report's verdict says so,
with the failures by kind (and, for an app answering 404/405, its routes). When they fail
only under the probes, the probes are at fault: the run says so and measures again without
them, rather than blame the endpoint.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..environment import CpuReading, available_cpus, helper_cpu_seconds, idle_cpu_seconds, minor_faults
from ..exceptions import EndpointError
from ..report import Report
from ..sections import Verdict  # (importable from here as before)
from .assemble import evidence_of, report_of
from .evidence import BatchProbe, Evidence, Machine, Repeated, Warm, WhatIf
from .batchprobe import NO_CALL, probe_captured
from .probes import Probes
from .restart import Due, run_fresh
from .summary import data_load_keys, repeated_of, warm_of
from .failures import ExceptionLog
from .sampler import StackSampler
from .experiments import AT_CONCURRENCY, PER_REQUEST
from .experiments.threads import thread_target
from .endpoints import UNFINISHED, Observation, Endpoint, make_endpoint
from .options import MIN_OK_REQUESTS, DoctorOptions
from .send import Send
from .served import ALONE_MAX_S, SERVED_ALONE, unprobed_alone, unprobed_concurrent
from .verdict import verdict_of

__all__ = ["DoctorOptions", "Verdict", "diagnose"]


#: The probes are blamed only when this share of probed requests failed and every one of
#: this many unprobed requests succeeded.
PROBE_BLAME_SHARE, PROBE_BLAME_CHECKS = 0.8, 2
#: The share of ``experiment_seconds`` the experiments at concurrency keep, whatever the ones
#: at one client (which run first) used.
LATE_SHARE = 0.5
#: The run (the target's import included, where the command line timed it) aims to end within
#: ``max_seconds`` + ``experiment_seconds`` + this (the batch probe, the fresh processes): the
#: experiments at concurrency get what is left of it once the fresh processes' expected time is
#: kept for them
RUN_EXTRA_S = 22.0


class _Run:
    """One doctor run over one endpoint. ``execute()`` fills the fields; ``report()`` builds
    the Report from them."""

    def __init__(
        self,
        endpoint: Endpoint,
        send: Send,
        options: DoctorOptions,
        tick: Callable[[str, float], None],
        repeat_cold: Callable[[], tuple[float | None, float | None, str | None]] | None = None,
        try_environment: Callable[[dict[str, str], str, float], WhatIf] | None = None,
        import_s: float = 0.0,
    ) -> None:
        self.endpoint, self.send, self.options, self.tick = endpoint, send, options, tick
        self.import_s = import_s  # (before the run: in its aim and its seconds, not in the measuring budget)
        self.repeat_cold, self.try_environment = repeat_cold, try_environment
        self.repeated_cold: tuple[float | None, float | None, str | None] | None = None
        self.machine = Machine(cpus_available=available_cpus())
        self.body = send.body
        self.probes = Probes()
        self.sampler = StackSampler()
        self.loop_watched = False  # (whether the loop watch ticks: ``_observed``)
        #: the endpoint's exceptions as its server logs them (a 500's reason)
        self.exceptions = ExceptionLog()
        self.started = time.perf_counter()
        self.cold: Observation | None = None
        self.warm: list[Observation] = []
        self.conc: list[Observation] = []
        self.conc_elapsed = 0.0
        self.concurrent_extra: dict[str, Any] = {}
        self.served: dict[str, float | None] = {}  # the concurrent load without probes or sampler
        self.warm_faults: float | None = None  # the process's minor page faults a sequential request
        self.warm_cores: float | None = None  # the process's cores over the sequential requests
        self.probe: BatchProbe | None = None
        self.missing: dict[str, str] = {}
        self.probes_at_fault: str | None = None
        self.start_error: str | None = None
        self.varied: Observation | None = None
        self.repeated: Repeated | None = None
        self.constant: frozenset[str] = frozenset()
        self.experiments: dict[str, WhatIf] = {}
        self.lab_s = 0.0  # time spent in experiments so far
        self.aside_s = 0.0  # ... and in requests without the probes at one client (_served_alone)
        self.lab_base: Any = None  # the endpoint as written, as the experiments first measured it
        self.data_keys: frozenset[int] = frozenset()  # loads of the request's own data (summary.data_load_keys)

    def _left(self) -> float:
        """What is left of ``max_seconds`` for measuring (the experiments have their own)."""
        return self.options.max_seconds - (time.perf_counter() - self.started - self.lab_s - self.aside_s)

    def _warm_phase(self, budget_s: float) -> list[Observation]:
        """Sequential requests, each with the whole ``--timeout``: new ones start until
        ``budget_s`` has passed (and at least ``MIN_OK_REQUESTS`` ran), so a slow endpoint is
        measured, never cut off and called failed. A request that times out ends the phase
        (the next ones would only queue behind it)."""
        o, out = self.options, []
        faults0, cpu0, t0 = minor_faults(), time.process_time(), time.perf_counter()
        deadline = t0 + budget_s
        for i in range(o.requests):
            if i >= MIN_OK_REQUESTS and time.perf_counter() > deadline:
                break
            obs = self.endpoint.request(self.body, o.timeout_s)
            obs.answer = None  # (only the experiments compare answers: none is kept here)
            out.append(obs)
            self.tick("sequential requests", (i + 1) / o.requests)
            if obs.error and obs.error.startswith("timeout"):
                break
        wall = time.perf_counter() - t0
        self.warm_cores = round((time.process_time() - cpu0) / wall, 2) if wall > 0 else None
        self.warm_faults = round((minor_faults() - faults0) / len(out), 1) if out else None
        return out

    def _warm_evidence(self) -> Warm:
        warm = warm_of(self.warm, self.data_keys)
        warm.cpu_cores_busy = self.warm_cores
        warm.minor_faults_per_request = self.warm_faults
        return warm

    def execute(self) -> None:
        o = self.options
        self.probes.install()
        try:
            try:
                self.endpoint.start(o.timeout_s)
            except EndpointError as exc:
                self.start_error = str(exc)
                return
            t0 = time.perf_counter()
            self.endpoint.ready_load()  # (an app's requests come from the helper process from the first, as its clients' do)
            self.aside_s += time.perf_counter() - t0
            self.tick("cold request", 0.0)
            self.exceptions.__enter__()  # (after start: uvicorn configures its loggers there)
            self.cold = self.endpoint.request(self.body, o.timeout_s)
            # the start-up's objects (the imports', the model's, the doctor's own) are still in
            # the collector's young generations: its first full collection would land on a warm
            # request (130 ms of an 8-ms Pillow endpoint's first warm request, every run), a
            # cost of starting, not of serving. It runs now, before any request is timed
            gc.collect()
            with self._observed():
                reading = CpuReading()
                with self.sampler.precise_lines():
                    self.warm = self._warm_phase(max(self._left() * 0.5, 1.0))
                if any(w.error for w in self.warm):
                    self._check_the_probes()
                if not any(w.error is None for w in self.warm):
                    return  # nothing succeeded: more load would only repeat the failure
                self._varied_request()
                self._machine(reading)  # (for the thread experiment: what the neighbours left free)
                self._per_request_experiments()
                self._concurrent_phase()
                self._machine(reading)  # (over the warm and the concurrent requests: long enough to read)
            self.probes.remove()  # the batch probe times the model alone, without the probes' hooks
            self._served_phase()
            self.tick("batch probe", 0.0)
            self._batch_probe()
            self._experiments(AT_CONCURRENCY)
        finally:
            self.exceptions.__exit__()
            self.probes.remove()
            self.endpoint.stop()
        if self.start_error is None and self.cold is not None:
            run_fresh(self, Due.of(self))  # (fresh processes: after this one's endpoint has stopped)

    def _check_the_probes(self) -> None:
        """Most requests failed under the probes: requests without them tell whose fault it
        is. Only when nearly all probed requests failed and every unprobed one succeeds are
        the probes to blame; then the run measures again without them. An endpoint that fails
        now and then keeps its probed evidence, and its failures are reported."""
        failed = sum(1 for w in self.warm if w.error)
        if failed < PROBE_BLAME_SHARE * len(self.warm):
            return
        self.probes.remove()
        bare = [self.endpoint.request(self.body, self.options.timeout_s) for _ in range(PROBE_BLAME_CHECKS)]
        if all(b.error is None for b in bare):
            first = next(w.error for w in self.warm if w.error)
            self.probes_at_fault = (
                f"{failed} of {len(self.warm)} requests failed under the probes ({first}) and {len(bare)} of {len(bare)} succeeded without them"
            )
            self.missing.update(
                {
                    "warm.forwards": "the probes were switched off (" + self.probes_at_fault + ")",
                    "batch_probe": "the probes were switched off, so no model input was captured",
                }
            )
            self.warm = self._warm_phase(max(self._left() * 0.5, 1.0))
        else:
            self.probes.install()

    def _varied_request(self) -> None:
        """One request with the payload's strings and decimals changed a little: a model call
        whose inputs stay the same is work the endpoint repeats whatever it is asked."""
        if self.probes_at_fault:
            return
        varied, why = self.send.varied()
        if varied is None:
            self.missing["repeated"] = f"{why}, so inputs that never change cannot be told apart"
            return
        before = dict(self.exceptions.seen)
        obs = self.endpoint.request(varied.body, self.options.timeout_s, path=varied.path if varied.path != self.send.path else None)
        raised = self.exceptions.take_since(before)  # (the doctor's own request: not the endpoint failing on the user's)
        if obs.error:
            why = obs.error + (f"; it raised {'; '.join(raised)}" if raised else "")
            self.missing["repeated"] = f"a request with the payload varied failed ({why}), so inputs that never change cannot be told apart"
        else:
            self.varied = obs
            ok = [w for w in self.warm if w.error is None]
            self.repeated, self.constant = repeated_of(ok, obs)
            self.data_keys = data_load_keys(ok, obs)

    def _concurrent_phase(self) -> None:
        o = self.options
        with self._ticking("concurrent requests"):
            self.endpoint.ready_load()  # (an app's helper process starts before the phase's clock and budget)
            budget = max(self._left() * 0.75, 1.0)
            if self.endpoint.loop_thread_id:  # (does the loop's own thread stop in a blocking wait?)
                self.sampler.watch.add(self.endpoint.loop_thread_id)
            cpu0, idle0, help0, t0 = time.process_time(), idle_cpu_seconds(), helper_cpu_seconds(), time.perf_counter_ns()
            self.conc, self.conc_elapsed = self.endpoint.concurrent(self.body, o.concurrency, o.concurrent_requests, o.timeout_s, budget)
        cpu1, idle1, help1, t1 = time.process_time(), idle_cpu_seconds(), helper_cpu_seconds(), time.perf_counter_ns()
        wall_s = (t1 - t0) / 1e9
        self.conc = [c for c in self.conc if c.error != UNFINISHED]  # cut off by the budget
        for c in self.conc:
            c.answer = None
        loop_tid = self.endpoint.loop_thread_id
        exclude = {threading.get_ident(), loop_tid or 0}  # (the run's own thread)
        exclude |= {t.ident or 0 for t in threading.enumerate() if t.name.startswith(("servescope-caller", "servescope-sampler", "servescope-ticker"))}
        if self.sampler.gil_wait_p50_ms(t0, t1) is None:
            self.missing["concurrent.cpu"] = f"the concurrent phase ({(t1 - t0) / 1e6:.0f} ms) was too short for the sampler to measure GIL waits"
        self.concurrent_extra = {
            "loop": self.sampler.loop_activity(loop_tid, t0, t1) if loop_tid else None,
            "cpu_cores_busy": round((cpu1 - cpu0) / wall_s, 2) if t1 > t0 else None,
            # (cores no other process used: the load's helper process is the doctor's own client)
            "machine_cores_idle": round((idle1 - idle0 + help1 - help0) / wall_s, 2) if t1 > t0 and idle0 is not None and idle1 is not None else None,
            "gil_wait_p50_ms": self.sampler.gil_wait_p50_ms(t0, t1),
            "worker_hot_spot": self.sampler.threads_hot_spot(t0, t1, exclude),
            "load_from": self.endpoint.load_from,
        }

    def _served_alone(self) -> None:
        """``SERVED_ALONE`` requests one at a time without the probes and the sampler (called
        with both off), before the concurrent burst as the sequential phase: the one-caller
        figure set against the unprobed concurrent load's (doctor/served.py). Its time is kept
        out of the measuring budget and the experiments' (the run's aim still counts it)."""
        ok = [w.latency_ms for w in self.warm if w.error is None]
        if not ok:
            return
        t0 = time.perf_counter()
        with self._ticking("requests without the probes"):
            self.endpoint.ready_load()  # (the helper sends them, as it sends the concurrent load)
            alone, missing = unprobed_alone(self.endpoint, self.body, timeout_s=self.options.timeout_s,
                                            budget_s=min(max(2 * SERVED_ALONE * statistics.median(ok) / 1000, 1.0), ALONE_MAX_S))  # fmt: skip
        self.aside_s += time.perf_counter() - t0
        self.served.update(alone)
        self.missing.update(missing)

    def _served_phase(self) -> None:
        """The concurrent phase's load once more, as many requests, without the probes and the
        sampler (doctor/served.py), where that phase finished cleanly and the measuring time has
        room for it (requests cut off would run on beside what follows)."""
        o = self.options
        if len(self.conc) < o.concurrency or self.conc_elapsed <= 0 or any(c.error for c in self.conc):
            self.missing["concurrent.served"] = "the concurrent phase had failed or unfinished requests, so its load was not run again without the probes"
            return
        if self._left() < self.conc_elapsed:
            self.missing["concurrent.served"] = f"no time was left to run the concurrent load again without the probes ({self.conc_elapsed:.1f} s)"
            return
        with self._ticking("concurrent requests without the probes"):
            served, missing = unprobed_concurrent(
                self.endpoint, self.body, concurrency=o.concurrency, requests=len(self.conc), timeout_s=o.timeout_s,
                budget_s=min(self.conc_elapsed * 2, self._left()), load_from=self.concurrent_extra.get("load_from", ""),
            )  # fmt: skip
        self.served.update(served)
        self.missing.update(missing)

    @contextmanager
    def _observed(self) -> Iterator[None]:
        """The sampler's sweeps and the loop watch's ticks (endpoints/loop_watch.py), only while
        the doctor observes: each takes the GIL every few ms from the endpoint's own threads,
        which the phases that time it as it runs must not pay."""
        with self._watching(True), self.sampler:
            yield

    @contextmanager
    def _unobserved(self) -> Iterator[None]:
        with self._watching(False), self.sampler.paused():
            yield

    @contextmanager
    def _watching(self, on: bool) -> Iterator[None]:
        """The loop watch on or off for a while, then as it was."""
        before, self.loop_watched = self.loop_watched, on
        self.endpoint.loop_watch.watching(on)
        try:
            yield
        finally:
            self.loop_watched = before
            self.endpoint.loop_watch.watching(before)

    @contextmanager
    def _ticking(self, phase: str) -> Iterator[None]:
        """The parent hears from the run every second while a phase lasts."""
        self.tick(phase, 0.0)
        done = threading.Event()

        def still_going() -> None:
            while not done.wait(1.0):
                self.tick(phase, 0.5)

        threading.Thread(target=still_going, daemon=True, name="servescope-ticker").start()
        try:
            yield
        finally:
            done.set()

    def _batch_probe(self) -> None:
        calls = self.probes.captured.get("calls") or {}
        if not calls:
            self.missing.setdefault("batch_probe", NO_CALL)
            return
        fewer = lambda: thread_target(self._evidence())  # noqa: E731 - (on a busy machine: the CPUs the neighbours left free)
        busy = self.machine.busy and self.probes.torch is not None
        self.probe, why = probe_captured(calls, self.constant, self.probes.torch, self.options, fewer if busy else None)
        if why:
            self.missing["batch_probe"] = why

    def _machine(self, reading: CpuReading) -> None:
        """How busy the machine was while the doctor measured (the warm and the concurrent
        requests), said in the report: timings on a busy machine are slower and noisier."""
        m = self.machine
        if reading.readable_in() > 0 and m.others_cores is None:
            # requests this fast are over before the kernel's CPU counts say anything: idle the
            # rest of the reading's minimum (the doctor's own threads do nothing meanwhile)
            time.sleep(reading.readable_in())
        m.cores_idle, m.others_cores, m.cpu_pressure = reading.since()
        ok = [w.latency_ms for w in self.warm if w.error is None]
        if len(ok) >= 3:
            p50 = float(np.percentile(ok, 50))
            m.warm_p90_over_p50 = round(float(np.percentile(ok, 90)) / p50, 2) if p50 > 0 else None
        from ..rules.savings import BUSY_CORES

        # (CPU pressure alone is not taken for a neighbour: it counts the doctor's own callers)
        m.busy = m.others_cores is not None and m.others_cores >= BUSY_CORES
        m.why_busy = f"other processes kept {m.others_cores:.1f} of {m.cpus_available:g} cores busy while the doctor measured" if m.busy else ""

    def _per_request_experiments(self) -> None:
        """The fixes tried at one client, right after the sequential requests and before the
        concurrent burst, so their blocks run in the state the warm requests measured: on a busy
        machine a burst of concurrent calls can leave the process several times faster at one
        client for a while, and a saving measured then would not be the endpoint's."""
        if self.probes_at_fault is None and any(w.error is None for w in self.warm):
            self.probes.remove()  # (the experiments time the endpoint without the probes' hooks ...)
            try:
                with self._unobserved():  # (... and without the sampler's sweeps or the loop watch's ticks)
                    self._served_alone()
                    self._experiments(PER_REQUEST)
            finally:
                self.probes.install()

    def _experiments(self, names: Iterable[str]) -> None:
        """Try each fix of ``names`` the evidence calls for on the endpoint itself
        (doctor/experiments/), without the probes, so the savings the findings name are measured
        ones. The experiments share ``experiment_seconds``; those at concurrency keep at least
        ``LATE_SHARE`` of it."""
        o = self.options
        if o.experiment_seconds <= 0 or self.probes_at_fault or self.verdict().diagnosed is False:
            return
        from .experiments import Lab, Seen, run_experiments

        t0 = time.perf_counter()
        ev = self._evidence()
        budget = o.experiment_seconds - self.lab_s
        rps, short = None, ""
        if AT_CONCURRENCY.issuperset(names):
            wanted, aim_left = max(budget, LATE_SHARE * o.experiment_seconds), self._run_left() - Due.of(self, ev).expected_s(self, ev)
            budget = min(wanted, aim_left)
            if aim_left < wanted and self.import_s >= 1.0:  # (said where the fixes at concurrency find too little time)
                aim = o.max_seconds + o.experiment_seconds + RUN_EXTRA_S
                short = f" (the run aims to end within {aim:.0f} s, and importing the target took {self.import_s:.0f} s of them)"
            # (what a block at c=N takes without the probes, as the fixes' blocks run)
            rps = (ev.concurrent.served_rps or ev.concurrent.throughput_rps) if ev.concurrent is not None else None
        elif self.try_environment is not None:  # (the fresh processes' blocks come out of the same time)
            from .fresh import churn_called_for, fresh_blocks_s, passive_called_for

            budget -= fresh_blocks_s(o) * (passive_called_for(ev) + churn_called_for(ev))
        lab = Lab(self.endpoint, self.body, timeout_s=o.timeout_s, budget_s=budget, tick=lambda phase: self.tick(phase, 0.5), base=self.lab_base,
                  concurrent_rps=rps, short=short)  # fmt: skip
        self.tick("trying fixes", 0.0)
        try:
            seen = Seen.from_probes(self.probes, self.constant, self.data_keys)
            self.experiments.update(run_experiments(ev, lab, seen, frozenset(names), busy=self.machine.busy))
        finally:
            self.lab_s += time.perf_counter() - t0
            self.lab_base = lab.base  # (the next phase's fixes compare with the same answer)

    def _run_left(self) -> float:
        o = self.options
        return o.max_seconds + o.experiment_seconds + RUN_EXTRA_S - (time.perf_counter() - self.started) - self.import_s

    # -- the report ----------------------------------------------------------------------------
    def verdict(self) -> Verdict:
        return verdict_of(self.cold, self.warm, self.conc, start_error=self.start_error, raised=self.exceptions.summaries,
                          endpoint=self.endpoint, path=self.options.path)  # fmt: skip

    def _evidence(self) -> Evidence:
        """What the run measured, typed: for the experiments, then the rules (doctor/assemble.py)."""
        return evidence_of(self)

    def report(self, target_name: str) -> Report:
        return report_of(self, target_name)


def diagnose(
    obj: Any,
    *,
    payload: Any = None,
    options: DoctorOptions | None = None,
    progress: Callable[[str, float], None] | None = None,
    target_name: str = "",
    repeat_cold: Callable[[], tuple[float | None, float | None, str | None]] | None = None,
    try_environment: Callable[[dict[str, str], str, float], WhatIf] | None = None,
    import_s: float = 0.0,
) -> Report:
    """Run the endpoint under probes, in this process, and return the Report: its verdict
    (``report.diagnosis.verdict``), findings and what could not be checked. The command line runs
    this in a child process (``isolate.py``); call it directly for an endpoint you trust
    to return. ``payload`` is the JSON body (None: none, or ``options.files`` as a form);
    ``repeat_cold`` starts the endpoint again in a fresh process and returns its first
    request's ms, the p50 after it and an error (doctor/cold.py): without it, a slow first
    request that no load explains is not claimed, it is listed as not checked.
    ``try_environment(change, words, budget_s)`` times fresh processes of the endpoint as
    written and with ``change`` in their environment (doctor/fresh.py): a setting read only
    when a library loads (OpenMP's wait policy) is tried that way, or not at all. ``import_s``:
    how long importing the target took before this call (the command line's child times it);
    it counts in the run's aim and its ``seconds``, so a slow import leaves the fixes at
    concurrency less time rather than make the run longer."""
    options = options or DoctorOptions()
    send = Send.of(payload, path=options.path, files=options.upload())
    endpoint = make_endpoint(obj, path=options.path, send=send, method=options.method)
    run = _Run(endpoint, send, options, progress or (lambda phase, frac: None), repeat_cold, try_environment, import_s)
    run.execute()
    return run.report(target_name)
