"""A fix that lives in the environment (OpenMP's wait policy), tried in fresh processes of the
endpoint (doctor/fresh.py), and the rule that names it only when it was measured."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace
import pytest

from servescope.doctor.evidence import Environment, Forwards, Machine, WhatIf
from servescope.doctor.fresh import compare_environments
from servescope.doctor.options import DoctorOptions
from servescope.rules import diagnose_evidence

from test_rules import healthy

OPTIONS = DoctorOptions(timeout_s=20.0)


def endpoint(tmp_path, body: str) -> str:
    (tmp_path / "fresh_app.py").write_text(textwrap.dedent(body))
    (tmp_path / "payload.json").write_text('{"x": 1}')
    return f"{tmp_path / 'fresh_app.py'}:predict"


def compare(tmp_path, spec: str, change: dict, budget_s: float):
    return compare_environments(spec, str(tmp_path / "payload.json"), OPTIONS, change, words="the change", budget_s=budget_s)


def test_a_setting_read_at_import_is_measured_in_two_fresh_processes(tmp_path, monkeypatch):
    # the endpoint reads its delay when it loads, as OpenMP reads its wait policy: 60 ms as
    # written (the user's environment), 10 ms with the change
    monkeypatch.setenv("FRESH_TEST_DELAY_MS", "60")
    spec = endpoint(tmp_path, """
        import os, time
        DELAY = float(os.environ["FRESH_TEST_DELAY_MS"]) / 1000
        def predict(payload):
            time.sleep(DELAY)
            return {"ok": True}
    """)
    w = compare(tmp_path, spec, {"FRESH_TEST_DELAY_MS": "10"}, 3.0)
    assert w.tried, w.why_not
    assert w.saving_ms == pytest.approx(50.0, abs=5.0) and w.low_ms > 40 and w.pairs >= 5 and w.coverage >= 0.9
    assert w.base_p50_ms == pytest.approx(60.0, abs=6.0) and w.fixed_p50_ms == pytest.approx(10.0, abs=6.0)
    assert w.answers == "same" and "set in a fresh process" in w.fix


def logs_its_first_request(tmp_path, monkeypatch, first_s: float, then_s: float = 0.0) -> str:
    """An endpoint whose first request takes ``first_s`` and writes when it ran to a file named
    for its process's arm (A as written, B with the change: ``{"FRESH_TEST_ARM": "B"}``)."""
    monkeypatch.setenv("FRESH_TEST_ARM", "A")
    monkeypatch.setenv("FRESH_TEST_LOG", str(tmp_path))
    return endpoint(tmp_path, f"""
        import os, pathlib, time
        FIRST = [True]
        def predict(payload):
            if FIRST[0]:
                FIRST[0], t0 = False, time.time()
                time.sleep({first_s})
                pathlib.Path(os.environ["FRESH_TEST_LOG"], os.environ["FRESH_TEST_ARM"]).write_text(f"{{t0}} {{time.time()}}")
            time.sleep({then_s})
            return {{"ok": True}}
    """)


def test_the_two_processes_first_requests_run_at_once(tmp_path, monkeypatch):
    # a first request that costs a second (imports, caches) is paid once in the run, not twice
    spec = logs_its_first_request(tmp_path, monkeypatch, first_s=1.0)
    w = compare(tmp_path, spec, {"FRESH_TEST_ARM": "B"}, 1.0)
    assert w.tried, w.why_not
    (a0, a1), (b0, b1) = (map(float, (tmp_path / arm).read_text().split()) for arm in "AB")
    assert a0 < b1 and b0 < a1  # the two first requests overlapped


def test_a_block_ends_on_time_when_requests_turn_slow_after_the_warm_ones(tmp_path, monkeypatch):
    # blocks are sized from the warm requests; a process whose later requests run 10x slower
    # (OpenMP's threads spinning beside a neighbour: 25 ms, then 1.6 s a request) must not make
    # each block take that many slow requests (a gallery run took 150 s)
    import servescope.doctor.fresh as fresh

    monkeypatch.setattr(fresh, "BLOCK_S", 0.1)  # 20 requests a block at the warm 5 ms
    spec = endpoint(tmp_path, """
        import time
        CALLS = [0]
        def predict(payload):
            CALLS[0] += 1
            time.sleep(0.005 if CALLS[0] <= 2 else 0.05)
            return {"ok": True}
    """)
    w = compare(tmp_path, spec, {"FRESH_TEST_UNUSED": "1"}, 0.5)
    assert w.tried, w.why_not
    # a block stops once twice its planned time has passed: 0.2 s, 4-5 requests of 50 ms, not 20
    assert w.requests <= 6 * w.pairs, (w.requests, w.pairs)
    assert w.base_p50_ms == pytest.approx(50.0, abs=15.0)


def test_a_fresh_process_that_fails_or_answers_otherwise_is_not_tried_with_why(tmp_path):
    spec = endpoint(tmp_path, """
        import os
        if os.environ.get("FRESH_TEST_BREAK") == "start":
            raise RuntimeError("no such setting")
        def predict(payload):
            return {"mode": os.environ.get("FRESH_TEST_BREAK", "")}
    """)
    w = compare(tmp_path, spec, {"FRESH_TEST_BREAK": "start"}, 1.0)
    assert not w.tried and "with the fix did not start" in w.why_not and "no such setting" in w.why_not
    w = compare(tmp_path, spec, {"FRESH_TEST_BREAK": "other"}, 1.0)
    assert not w.tried and "answered the same body differently" in w.why_not


def spinning(**experiment) -> object:
    ev = healthy(machine=Machine(cpus_available=2, others_cores=1.0, busy=True),
                 environment=Environment(torch_threads=2, cpus_available=2, workers=1, omp_wait_policy="default"))  # fmt: skip
    ev.warm.forwards = Forwards(count=30, per_request=1, batch_sizes=[1], kinds=["torch"], mean_ms=1.0)
    ev.p50_ms = 100.0
    if experiment:
        ev.experiments["omp-passive"] = WhatIf(fix="OMP_WAIT_POLICY=PASSIVE", **experiment)
    return ev


def rule_said(ev) -> tuple[list, dict]:
    d = diagnose_evidence(ev)
    return [f for f in d.findings if f.id == "openmp-spin-wait"], d.not_checked


def test_openmp_spinning_is_named_only_when_passive_measurably_won_in_fresh_processes():
    won = dict(tried=True, pairs=6, base_p50_ms=1100.0, fixed_p50_ms=99.0, saving_ms=1000.0, low_ms=950.0, high_ms=1050.0,
               coverage=0.97, others_cores=1.0)  # fmt: skip
    [f], _ = rule_said(spinning(**won))
    assert f.severity == "critical" and f.saving_ms == 1000.0 and f.saving_basis == "measured"
    assert f.saving_load == "c=1, fresh process" and "OMP_WAIT_POLICY=PASSIVE" in f.fix
    assert "1100 -> 99 ms at c=1" in f.detail
    # sentence-transformers' encode is a torch model too (its kind is its own)
    ev = spinning(**won)
    ev.warm.forwards.kinds = ["sentence-transformers"]
    assert [f.id for f in rule_said(ev)[0]] == ["openmp-spin-wait"]
    ev.warm.forwards.kinds = ["onnxruntime"]  # (ONNX Runtime's threads are its own, not OpenMP's)
    assert rule_said(ev) == ([], {})
    # the doctor's own process ran 11x faster: its other milliseconds are said to be off
    assert "several-fold off" in f.detail and f.evidence["doctor_p50_ms"] == 100.0
    # an interval reaching zero, too few pairs, or a small gain: not named
    for change in ({"low_ms": -5.0}, {"coverage": 0.75}, {"saving_ms": 50.0, "low_ms": 20.0}):
        assert rule_said(spinning(**{**won, **change}))[0] == []
    # not tried: said, with why, never silently nothing
    found, not_checked = rule_said(spinning(why_not="the fresh process with the fix did not start: boom"))
    assert found == [] and "boom" in not_checked["openmp-spin-wait"]
    found, not_checked = rule_said(spinning())
    assert found == [] and "servescope doctor FILE:app" in not_checked["openmp-spin-wait"]


@pytest.mark.parametrize("change", [{"machine": Machine(cpus_available=2, others_cores=0.1)}, {"omp_wait_policy": "OMP_WAIT_POLICY=ACTIVE"}, {"torch_threads": 1}])
def test_a_quiet_machine_a_policy_the_user_set_or_one_thread_is_no_case_for_it(change):
    ev = spinning()
    if "machine" in change:
        ev.machine = change["machine"]
    else:
        for k, v in change.items():
            setattr(ev.environment, k, v)
    found, not_checked = rule_said(ev)
    assert found == [] and "openmp-spin-wait" not in not_checked


def test_the_thread_fix_says_the_policy_was_tried_once_it_was():
    ev = spinning(tried=True, pairs=6, base_p50_ms=1100.0, fixed_p50_ms=99.0, saving_ms=1000.0, low_ms=950.0, high_ms=1050.0, coverage=0.97)
    ev.experiments["torch-threads"] = WhatIf(fix="torch.set_num_threads(1)", tried=True, pairs=6, base_p50_ms=100.0, fixed_p50_ms=60.0,
                                             saving_ms=40.0, low_ms=30.0, high_ms=50.0, coverage=0.97)  # fmt: skip
    [f] = [f for f in diagnose_evidence(ev).findings if f.id == "thread-oversubscription"]
    assert "tried in fresh processes of the endpoint: p50 1100 -> 99 ms" in f.fix
    del ev.experiments["omp-passive"]
    [f] = [f for f in diagnose_evidence(ev).findings if f.id == "thread-oversubscription"]
    assert "not tried by the doctor" in f.fix


def test_the_policy_is_tried_only_where_called_for_and_a_failing_try_is_reported():
    from servescope.doctor.fresh import try_wait_policy

    asked = []

    def try_environment(change, words, budget_s):
        asked.append((change, budget_s))
        raise OSError("no more processes")

    options = DoctorOptions(experiment_seconds=30.0)
    quiet = spinning()
    quiet.machine = Machine(cpus_available=2, others_cores=0.1)
    assert try_wait_policy(quiet, try_environment, options) is None and asked == []
    w = try_wait_policy(spinning(), try_environment, options)
    assert asked == [({"OMP_WAIT_POLICY": "PASSIVE"}, 6.0)]  # (half the experiments' time, 6 s at most)
    assert not w.tried and "the experiment failed: OSError: no more processes" in w.why_not


def test_a_try_is_expected_to_take_both_starts_the_warm_requests_and_the_least_pairs():
    from servescope.doctor.fresh import FreshTrials

    # measured beside a neighbour (hf_search_fastapi): the doctor's own import of the target
    # took 3.9 s, its p50 was 923 ms, and the try in fresh processes took 21.7 s
    trials = FreshTrials("app.py:app", None, OPTIONS, import_s=3.9)
    assert 0.8 * 21.7 <= trials.expected_s(923.0) <= 1.2 * 21.7
    # a fast endpoint: the starts and the blocks' own time; an unknown import is taken as 5 s
    assert trials.expected_s(5.0) == pytest.approx(2 * 3.9 + 6.0, abs=0.1)
    assert FreshTrials("app.py:app", None, OPTIONS).expected_s(5.0) == pytest.approx(2 * 5.0 + 6.0, abs=0.1)


class _Trials:
    """A ``try_environment`` that says what it was asked, and its time."""

    def __init__(self) -> None:
        self.asked: list[bool] = []

    def __call__(self, change, words, budget_s, first_alone=False):
        self.asked.append(first_alone)
        return WhatIf(fix=words, tried=True, pairs=5, base_p50_ms=210.0, fixed_p50_ms=190.0, saving_ms=20.0, low_ms=15.0, high_ms=25.0,
                      coverage=0.94, base_first_ms=900.0 if first_alone else None)  # fmt: skip

    def expected_s(self, p50_ms, first_alone=False):
        return 10.0 + (1.5 * p50_ms / 1000 if first_alone else 0.0)


def test_a_second_first_request_due_with_the_wait_policy_is_its_process_as_written():
    """Beside a neighbour, a model loaded per request calls for both fresh-process steps: the
    wait policy's process as written times its first request alone and gives its p50, so the
    run starts two processes, not three (an import and six 1-s requests saved: about 15 s), and
    expects the time of the two."""
    from servescope.doctor.evidence import Evidence, Warm
    from servescope.doctor.restart import Due, run_fresh

    cold_asked, trials = [], _Trials()
    run = SimpleNamespace(repeat_cold=lambda: cold_asked.append(1) or (1.0, 2.0, None), probes_at_fault=None, import_s=3.0,
                          try_environment=trials, options=DoctorOptions(), experiments={}, repeated_cold=None, tick=lambda *a: None,
                          _evidence=spinning)  # fmt: skip
    loads = Evidence(target_kind="function", warm=Warm(p50_ms=200.0, loads_per_request=1.0))
    assert Due(cold=True, policy=True).expected_s(run, loads) == pytest.approx(10.0 + 0.3)  # (not + 3.0 + 6 * 0.2)
    run_fresh(run, Due(cold=True, policy=True))
    assert cold_asked == [] and trials.asked == [True]
    assert run.repeated_cold == (900.0, 210.0, None) and run.experiments["omp-passive"].saving_ms == 20.0
    run_fresh(run, Due(cold=True))  # (quiet: the second first request alone, in a process of its own)
    assert cold_asked == [1] and trials.asked == [True] and run.repeated_cold == (1.0, 2.0, None)


def test_a_first_request_timed_alone_runs_before_the_other_process_starts_its_own(tmp_path, monkeypatch):
    # where the process as written is also the doctor's second first request, its first request
    # must be timed with the other process idle, and it is kept
    spec = logs_its_first_request(tmp_path, monkeypatch, first_s=0.3, then_s=0.01)
    w = compare_environments(spec, str(tmp_path / "payload.json"), OPTIONS, {"FRESH_TEST_ARM": "B"}, words="the change", budget_s=1.0,
                             first_alone=True)  # fmt: skip
    assert w.tried, w.why_not
    (a0, a1), (b0, b1) = (map(float, (tmp_path / arm).read_text().split()) for arm in "AB")
    assert a1 <= b0  # A's first request ended before B's began
    assert 300 <= w.base_first_ms < 300 + 1000 and 10.0 <= w.base_p50_ms < 40.0  # (its p50: the requests after the first)
