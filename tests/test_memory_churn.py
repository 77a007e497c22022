"""Requests that fault fresh memory in on glibc's malloc (rules/memory.py): the setting that
keeps freed memory tried in fresh processes (doctor/fresh.py), what each process faulted, and
the rule that names the cause only where the fix measurably removed the faults and the time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from servescope.allocator import KEEP_FREED, allocator, malloc_setting
from servescope.doctor.evidence import Environment, WhatIf
from servescope.doctor.fresh import churn_called_for
from servescope.doctor.options import DoctorOptions
from servescope.rules import diagnose_evidence

from test_fresh import compare, endpoint
from test_rules import healthy


def churning(faults: float = 40_000.0, **experiment) -> object:
    """A 200-ms request that faults ``faults`` pages in (the doctor's own process) on glibc."""
    ev = healthy(environment=Environment(torch_threads=2, cpus_available=2, workers=1, allocator="glibc"))
    ev.warm.minor_faults_per_request, ev.warm.p50_ms, ev.p50_ms = faults, 200.0, 200.0
    if experiment:
        ev.experiments["keep-freed-memory"] = WhatIf(fix="MALLOC_MMAP_THRESHOLD_=... , set in a fresh process", **experiment)
    return ev


MEASURED = dict(tried=True, pairs=7, base_p50_ms=260.0, fixed_p50_ms=196.0, saving_ms=60.0, low_ms=53.0, high_ms=88.0, coverage=0.98,
                base_faults_per_request=63_000.0, fixed_faults_per_request=2.0, extra_mb=261.0)  # fmt: skip


def said(ev):
    d = diagnose_evidence(ev)
    return [f for f in d.findings if f.id == "memory-churn"], d.not_checked


def test_the_cause_is_named_where_the_fix_removed_the_faults_and_the_time():
    [f], _ = said(churning(**MEASURED))
    # severity from the low end of its interval: 53 of the fresh process's 260 ms
    assert f.severity == "high" and f.saving_ms == 60.0 and f.saving_load == "c=1, fresh process" and f.saving_basis == "measured"
    assert f.evidence["minor_faults_per_request"] == 63_000.0 and f.evidence["faults_with_the_fix"] == 2.0
    assert "+261 MB resident" in f.detail and "MALLOC_TRIM_THRESHOLD_=1073741824" in f.fix and "MALLOC_MMAP_THRESHOLD_=33554432" in f.fix


@pytest.mark.parametrize("change", [
    dict(low_ms=-3.0),                                      # an interval that reaches zero
    dict(saving_ms=8.0, low_ms=5.0),                        # 3% of the request: two processes differ that much
    dict(fixed_faults_per_request=50_000.0),                # faster, but not by faulting less
])  # fmt: skip
def test_a_saving_that_is_not_this_cause_is_not_named(change):
    found, not_checked = said(churning(**{**MEASURED, **change}))
    assert found == [] and "memory-churn" not in not_checked


def test_called_for_only_on_glibc_as_it_ships_with_faults_that_cost():
    assert churn_called_for(churning())
    assert not churn_called_for(churning(faults=1_000.0))  # 1 ms of a 200-ms request
    ev = churning()
    ev.environment.malloc_setting = "MALLOC_TRIM_THRESHOLD_=1000000000"
    assert not churn_called_for(ev)
    ev = churning()
    ev.environment.allocator = "jemalloc"
    assert not churn_called_for(ev)
    ev = churning()
    ev.warm.loads_per_request, ev.warm.load_ms_per_request = 1.0, 80.0  # (load it once: its buffers go with it)
    assert not churn_called_for(ev)
    # not tried where it was called for: said, with why
    found, not_checked = said(churning())
    assert found == [] and "servescope doctor FILE:app" in not_checked["memory-churn"]
    found, not_checked = said(churning(why_not="the fresh process with the fix did not start: boom"))
    assert found == [] and "boom" in not_checked["memory-churn"]


def test_the_allocator_and_the_users_own_setting_are_read():
    assert malloc_setting({}) == "" and malloc_setting({"MALLOC_ARENA_MAX": "2"}) == ""
    assert malloc_setting({"MALLOC_TRIM_THRESHOLD_": "1000"}) == "MALLOC_TRIM_THRESHOLD_=1000"
    assert malloc_setting({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"}).startswith("GLIBC_TUNABLES=")
    assert malloc_setting({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}) == ""
    assert malloc_setting({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}).startswith("LD_PRELOAD=")
    assert allocator("/no/such/maps") in ("glibc", None)
    assert allocator() == "glibc"  # (this machine: Debian's glibc, nothing preloaded)


def test_fresh_processes_say_what_they_faulted_and_held(tmp_path):
    # each request keeps 8 buffers of 8 MB alive together (as a forward's activations are) and
    # drops them: glibc hands the 64 MB back and maps it again on the next request; kept, the
    # next request reuses it
    spec = endpoint(tmp_path, """
        import numpy as np
        def predict(payload):
            bufs = [np.ones(1_000_000) for _ in range(8)]
            return {"sum": float(sum(b[0] for b in bufs))}
    """)
    w = compare(tmp_path, spec, KEEP_FREED, 2.0)
    assert w.tried, w.why_not
    assert w.base_faults_per_request > 2_000 and w.fixed_faults_per_request < 0.1 * w.base_faults_per_request, (w.base_faults_per_request, w.fixed_faults_per_request)
    assert w.extra_mb > 30  # (the price: the fixed process keeps the 64 MB)


class _Trials:
    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []

    def __call__(self, change, words, budget_s, first_alone=False):
        self.asked.append((next(iter(change)), first_alone))
        return WhatIf(fix=words, tried=True, pairs=5, base_p50_ms=210.0, fixed_p50_ms=150.0, saving_ms=60.0, low_ms=50.0, high_ms=70.0,
                      coverage=0.94, base_first_ms=900.0 if first_alone else None, base_faults_per_request=50_000.0,
                      fixed_faults_per_request=1.0)  # fmt: skip

    def expected_s(self, p50_ms, first_alone=False):
        return 10.0 + (1.5 * p50_ms / 1000 if first_alone else 0.0)


def test_the_run_tries_each_setting_due_and_the_first_carries_the_second_first_request():
    from servescope.doctor.restart import Due, run_fresh
    from test_fresh import spinning

    def run_of(ev):
        return SimpleNamespace(repeat_cold=lambda: (1.0, 2.0, None), probes_at_fault=None, import_s=3.0, try_environment=_Trials(),
                               options=DoctorOptions(), experiments={}, repeated_cold=None, tick=lambda *a: None, _evidence=lambda: ev,
                               warm=[SimpleNamespace(error=None, latency_ms=200.0)], cold=None)  # fmt: skip

    run = run_of(churning())
    run_fresh(run, Due(churn=True))
    assert run.try_environment.asked == [("MALLOC_MMAP_THRESHOLD_", False)] and run.experiments["keep-freed-memory"].saving_ms == 60.0
    assert run.repeated_cold is None
    run = run_of(churning())
    run_fresh(run, Due(cold=True, churn=True))  # (one process as written: the second first request too)
    assert run.try_environment.asked == [("MALLOC_MMAP_THRESHOLD_", True)] and run.repeated_cold == (900.0, 210.0, None)
    both = spinning()
    both.environment.allocator, both.warm.minor_faults_per_request = "glibc", 40_000.0
    run = run_of(both)
    assert Due.of(run) == Due(policy=True, churn=True)
    assert Due(cold=True, policy=True, churn=True).expected_s(run, both) == pytest.approx(2 * 10.0 + 1.5 * both.warm.p50_ms / 1000)
    run_fresh(run, Due(cold=True, policy=True, churn=True))
    assert run.try_environment.asked == [("OMP_WAIT_POLICY", True), ("MALLOC_MMAP_THRESHOLD_", False)]
    assert set(run.experiments) == {"omp-passive", "keep-freed-memory"}


def test_a_second_first_request_whose_process_failed_to_start_says_why():
    from servescope.doctor.restart import Due, run_fresh

    def broken(change, words, budget_s, first_alone=False):
        raise RuntimeError("no fresh process today")  # (what _try reports; here it escapes to the thread)

    cold_asked = []
    run = SimpleNamespace(repeat_cold=lambda: cold_asked.append(1) or (1.0, 2.0, None), probes_at_fault=None, import_s=3.0,
                          try_environment=broken, options=DoctorOptions(), experiments={}, repeated_cold=None, tick=lambda *a: None,
                          _evidence=churning)  # fmt: skip
    run_fresh(run, Due(cold=True, churn=True))
    # the setting's try is reported as not tried, with why; its process gave no first request
    assert "no fresh process today" in run.experiments["keep-freed-memory"].why_not
    assert run.repeated_cold == (None, None, run.experiments["keep-freed-memory"].why_not) and cold_asked == []

