"""Each rule on hand-made, typed evidence: fires on its evidence, stays quiet on a healthy one,
and says "not checked" (never silently nothing) when a measurement it needs is missing."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from servescope.doctor.evidence import (
    WhatIf,
    BatchProbe,
    Cold,
    Concurrent,
    Environment,
    Evidence,
    Forwards,
    LoopActivity,
    MissingEvidence,
    Repeated,
    Warm,
)
from servescope.doctor.evidence import stage_shares
from servescope.exceptions import ReportError
from servescope.report import Finding, Report
from servescope.sections.doctor import Diagnosis as DoctorSection
from servescope.stats import Distribution
from servescope.rules import RULES, cap_savings, diagnose_evidence, diagnose_report
from servescope.rules.loads import model_load_per_request
from servescope.rules.concurrency import no_batching


def forwards(**over) -> Forwards:
    base = Forwards(count=30, per_request=1, batch_sizes=[1], max_batch=1, param_devices=["cpu"], input_devices=["cpu"], mean_ms=1.0, modules=["Sequential"])
    return dataclasses.replace(base, **over)


def healthy(**over) -> Evidence:
    ev = Evidence(
        target_kind="function",
        cold=Cold(latency_ms=3.0),
        warm=Warm(requests=30, p50_ms=2.0, h2d_per_request=1, d2h_per_request=1, syncs_per_request=1, copy_bytes_per_request=4096, forwards=forwards()),
        concurrent=Concurrent(
            concurrency=8, requests=48, throughput_rps=900, sequential_rps=500, p50_ms=8,
            forwards=forwards(batch_sizes=[1, 4, 8], max_batch=8), loop_lag_max_ms=3.0, loop_lag_p99_ms=1.0,
            cpu_cores_busy=1.9, gil_wait_p50_ms=0.1,
        ),
        batch_probe=BatchProbe(per_item_ms={"1": 1.0, "8": 0.2}, best_batch=8, gain=5.0, grad_ratio=1.0, train_ratio=1.0, forward_ms=1.0),
        environment=Environment(cuda_available=False, torch_threads=2, cpus_available=2, workers=1),
        repeated=Repeated(),
        p50_ms=2.0,
    )  # fmt: skip
    for path, value in over.items():
        *parents, last = path.split("__")
        node = ev
        for p in parents:
            node = getattr(node, p)
        setattr(node, last, value)
    return ev


def ids(ev: Evidence) -> set[tuple[str, str]]:
    return {(f.id, f.severity) for f in diagnose_evidence(ev).findings}


def test_a_healthy_endpoint_comes_out_clean_and_every_rule_was_checked():
    d = diagnose_evidence(healthy(p50_ms=10.0))
    assert d.findings == [] and d.not_checked == {}
    # a 2 ms request: the GIL cannot be told apart from the doctor's own work, and it says so
    assert set(diagnose_evidence(healthy()).not_checked) == {"gil-contention"}


@pytest.mark.parametrize(
    "over, expected",
    [
        ({"warm__loads_per_request": 2}, ("model-load-per-request", "info")),
        ({"cold__latency_ms": 900.0, "cold__repeat_ms": 850.0}, ("cold-start", "high")),
        ({"warm__module_moves_per_request": 1}, ("repeated-transfer", "info")),
        ({"warm__small_copies_per_request": 12}, ("repeated-transfer", "info")),
        ({"warm__forwards": forwards(training=30, training_changes_output=30)}, ("training-mode", "high")),
        ({"warm__forwards": forwards(grad=30)}, ("grad-enabled", "info")),
        ({"environment": Environment(torch_threads=8, cpus_available=2)}, ("thread-oversubscription", "high")),
        ({"warm__errors": 3, "warm__errors_sample": ["KeyError: 'text'"]}, ("failing-requests", "high")),
        ({"concurrent__errors": 2}, ("failing-requests", "high")),
    ],
)
def test_each_cause_fires_on_its_evidence(over, expected):
    assert ids(healthy(**over)) == {expected}


def test_a_present_cause_stays_listed_when_it_costs_nothing_measurable():
    # training mode on modules without dropout/batch-norm, and the timing ratio below 1 (noise):
    # the flag is still set, so the cause is listed, at info, every run
    ev = healthy(warm__forwards=forwards(training=30))
    ev.batch_probe.train_ratio = 0.954
    [f] = diagnose_evidence(ev).findings
    assert (f.id, f.severity, f.saving_ms) == ("training-mode", "info", None)


def test_modules_without_weights_built_per_request_are_not_a_model_load():
    assert diagnose_evidence(healthy(warm__constructed_per_request=1.0)).findings == []  # nn.Softmax(dim=-1)(x)
    [f] = diagnose_evidence(healthy(warm__constructed_per_request=3.0, warm__params_built_per_request=2570.0)).findings
    assert f.id == "model-load-per-request" and f.evidence["weights_built_per_request"] == 2570


def test_load_per_request_is_sized_by_what_it_costs():
    ev = healthy(warm__loads_per_request=2, warm__load_ms_per_request=15.0, p50_ms=20.0)
    [f] = diagnose_evidence(ev).findings
    assert f.id == "model-load-per-request" and f.severity == "critical" and f.saving_ms == 15.0
    assert "load once" in f.fix


@pytest.mark.parametrize("fresh_p50, says", [(130.0, "130 ms against 100 ms"), (80.0, "80 ms against 100 ms"), (108.0, None)])
def test_a_fresh_process_that_loads_at_another_speed_is_said(fresh_p50, says):
    # a 47-MB ONNX Runtime session built per request ran at 94-130 ms from process to process
    # (the allocator's history): the saving measured in one is said for that one
    ev = healthy(warm__loads_per_request=1, warm__load_ms_per_request=60.0, p50_ms=100.0, cold__repeat_p50_ms=fresh_p50,
                 cold__repeat_ms=fresh_p50 + 5, concurrent__served_alone_p50_ms=100.0)  # fmt: skip
    [f] = diagnose_evidence(ev).findings
    assert f.id == "model-load-per-request" and f.evidence["fresh_process_p50_ms"] == fresh_p50
    if says is None:  # within the spread a few requests have: nothing to say
        assert "fresh process" not in f.detail
    else:
        assert f"p50 {says} in this one" in f.detail
        assert f"the saving there is about {60.0 + fresh_p50 - 100.0:.3g} ms" in f.detail and f.saving_ms == 60.0


def test_no_batching_needs_concurrency_at_batch_one_and_a_real_gain():
    ev = healthy(concurrent__forwards=forwards(count=48))  # each of the 48 requests ran its own
    [f] = diagnose_evidence(ev).findings
    # at c=8 the 8 items would share one forward of 8 x 0.2 ms, plus 1 ms of work outside the
    # model: 2.6 ms instead of the 8 ms p50 measured at c=8
    assert f.id == "no-batching" and f.severity == "critical" and f.saving_load == "c=8"
    assert f.saving_ms == pytest.approx(5.4) and f.saving_basis == "estimated" and "batch probe" in f.detail
    # where both loads ran again without the probes, their p50s (a server's) are what it saves
    # from: 8 x 0.2 ms + (1.5 - 1) ms outside the model, against 6 ms
    bare = healthy(concurrent__forwards=forwards(count=48), concurrent__served_p50_ms=6.0, concurrent__served_alone_p50_ms=1.5)
    [f] = diagnose_evidence(bare).findings
    assert f.saving_ms == pytest.approx(3.9) and "instead of the 6 ms p50 measured at c=8 (without the probes)" in f.detail
    # never one of each: without the bare run at one client, both come from the probed phases
    [f] = diagnose_evidence(healthy(concurrent__forwards=forwards(count=48), concurrent__served_p50_ms=6.0)).findings
    assert f.saving_ms == pytest.approx(5.4) and "instead of the 8 ms p50 measured at c=8 (under the probes)" in f.detail
    # a runtime batching on its worker, running only the odd lone request in its own context
    assert diagnose_evidence(healthy(concurrent__forwards=forwards(count=3))).findings == []
    # a pipeline unpickled per request (20 ms of Python) around a 0.34 ms model call: the 221 ms
    # at c=8 is the loads queued on the GIL, and batching the calls takes out 8 x (0.34 - 0.05) ms
    loads = copy.deepcopy(ev)
    loads.batch_probe.per_item_ms, loads.batch_probe.gain = {"1": 0.34, "8": 0.05}, 6.8
    loads.p50_ms, loads.concurrent.p50_ms = 23.5, 221.0
    [f] = diagnose_evidence(loads).findings
    assert f.saving_ms == pytest.approx(8 * (0.34 - 0.05)) and "outside the model, queued" in f.detail
    assert f.severity in ("low", "info")
    tiny = copy.deepcopy(ev)
    tiny.batch_probe.per_item_ms = {"1": 0.05, "8": 0.01}
    tiny.p50_ms = 0.4
    assert diagnose_evidence(tiny).findings == []  # batching would not move it


def test_no_batching_after_per_item_calls_is_not_estimated_where_one_call_a_request_fills_the_best_batch():
    many = forwards(count=48 * 40, per_request=40.0)
    ev = healthy(concurrent__forwards=many, warm__forwards=forwards(per_request=40.0), concurrent__p50_ms=400.0, p50_ms=50.0, warm__p50_ms=50.0)
    before = [f for f in diagnose_evidence(copy.deepcopy(ev)).findings if f.id == "no-batching"]
    assert before and before[0].saving_ms  # (as written: 40 calls a request merged across callers)
    ev.experiments["batch-items"] = WhatIf(fix="i", tried=True, pairs=5, concurrency=1, base_p50_ms=120.0, fixed_p50_ms=6.0, saving_ms=114.0)
    [f] = [f for f in diagnose_evidence(ev).findings if f.id == "no-batching"]
    assert f.saving_ms is None and f.severity == "low" and "Not estimated: the 40 calls a request are its own items" in f.detail
    few = healthy(concurrent__forwards=forwards(count=48 * 4, per_request=4.0), warm__forwards=forwards(per_request=4.0), concurrent__p50_ms=60.0, p50_ms=6.0, warm__p50_ms=6.0)
    few.experiments["batch-items"] = ev.experiments["batch-items"]
    [g] = [f for f in diagnose_evidence(few).findings if f.id == "no-batching"]
    assert g.saving_ms and "takes part of it first" in g.detail


def test_no_batching_whose_fix_was_tried_and_gained_nothing_is_info():
    # the batch probe's per-item gain is real, but batching the endpoint's calls saved nothing
    # (Python work before the model held the GIL): by the doctor's own thresholds, info
    ev = healthy(concurrent__forwards=forwards(count=48))
    ev.experiments["batching"] = WhatIf(fix="f", tried=True, pairs=5, concurrency=8, base_p50_ms=171.0, fixed_p50_ms=191.0,
                                        saving_ms=-14.1, low_ms=-29.1, high_ms=-2.7)  # fmt: skip
    [f] = diagnose_evidence(ev).findings
    assert f.id == "no-batching" and f.severity == "info" and "no gain" in f.detail


def test_streams_that_each_run_their_own_decoding_loop_are_named_with_a_batched_step_fix():
    ev = healthy(concurrent__forwards=forwards(count=48 * 16, per_request=16.0), warm__first_chunk_p50_ms=3.0,
                 warm__forwards=forwards(per_request=16.0))  # fmt: skip
    [f] = diagnose_evidence(ev).findings
    assert f.id == "no-batching" and "streams each decode alone" in f.title
    assert "def infer(self, batch)" in f.fix and "yield" in f.fix and "torch.stack" not in f.fix
    compile(f.fix, "<fix>", "exec")
    plain = healthy(concurrent__forwards=forwards(count=48 * 16, per_request=16.0), warm__forwards=forwards(per_request=16.0))
    [f] = diagnose_evidence(plain).findings  # many forwards, but one answer at the end: not a stream
    assert "streams" not in f.title


def test_no_batching_without_a_batch_probe_is_not_checked_with_the_reason():
    ev = healthy(concurrent__forwards=forwards(count=48), batch_probe=None)
    ev.missing["batch_probe"] = "batch probe skipped: no model input was captured"
    d = diagnose_evidence(ev)
    assert d.findings == [] and d.not_checked["no-batching"] == "batch probe skipped: no model input was captured"
    ev.missing.clear()
    ev.batch_probe = BatchProbe(error="RuntimeError: shape mismatch")
    assert "shape mismatch" in diagnose_evidence(ev).not_checked["no-batching"]


def test_grad_enabled_is_sized_by_the_probe():
    ev = healthy(warm__forwards=forwards(grad=30))
    ev.batch_probe.grad_ratio = 1.5
    [f] = diagnose_evidence(ev).findings
    assert f.severity == "medium" and f.saving_ms == pytest.approx(1 / 3, abs=1e-3)


def test_model_on_cpu_with_a_gpu_available():
    ev = healthy(environment__cuda_available=True)
    assert ids(ev) == {("model-not-on-accelerator", "high")}
    ev.warm.forwards.param_devices = ["cuda:0"]
    assert diagnose_evidence(ev).findings == []


def test_event_loop_blocked_needs_the_work_on_the_loop_thread():
    on_loop = healthy(concurrent__forwards=forwards(count=48, on_event_loop=48, batch_sizes=[1, 8], max_batch=8))
    assert {i for i, _ in ids(on_loop)} == {"event-loop-blocked"}
    # servescope.serve runs a lone request on the loop when nothing else waits: not a block
    lone = healthy(concurrent__forwards=forwards(on_event_loop=3, batch_sizes=[1, 8], max_batch=8))
    assert diagnose_evidence(lone).findings == []
    # a lagging loop whose own thread was idle (the GIL held by worker threads): not the loop's doing
    gil = healthy(concurrent__loop_lag_max_ms=250.0, concurrent__loop=LoopActivity(samples=90, busy_samples=3, busy_share=0.03, longest_busy_ms=9.0))
    assert diagnose_evidence(gil).findings == []
    # the loop's own thread seen running code (FastAPI encoding a big response there)
    loop = LoopActivity(samples=100, busy_samples=60, busy_share=0.6, longest_busy_ms=40.0, hot_spot="fastapi/encoders.py:322 jsonable_encoder")
    busy = healthy(concurrent__loop=loop, concurrent__loop_lag_max_ms=38.0)
    [f] = diagnose_evidence(busy).findings
    assert f.id == "event-loop-blocked" and "jsonable_encoder" in f.evidence["on_the_loop"]
    # a loop busy with many short callbacks (HTTP for a fast endpoint) still wakes its tasks on time
    assert diagnose_evidence(healthy(concurrent__loop=loop, concurrent__loop_lag_max_ms=3.0)).findings == []


def test_a_forward_on_the_loop_of_a_machine_with_no_idle_core_gets_no_estimated_saving():
    # on worker threads the requests would share the same busy cores: an `async def` MiniLM
    # forward's p50 at c=8 rose from 75 to 105 ms once off the loop (the doctor had said 12 to gain)
    on_loop = dict(concurrent__forwards=forwards(count=48, on_event_loop=48, batch_sizes=[1], max_batch=1, mean_ms=12.0))
    [room] = [f for f in diagnose_evidence(healthy(**on_loop, concurrent__machine_cores_idle=1.2)).findings if f.id == "event-loop-blocked"]
    assert room.saving_ms > 0 and room.detail.startswith("Estimated from the time the loop's thread ran")
    [full] = [f for f in diagnose_evidence(healthy(**on_loop, concurrent__machine_cores_idle=0.05)).findings if f.id == "event-loop-blocked"]
    assert full.saving_ms is None and full.severity == "info"
    assert "No saving is estimated at c=8: the machine had 0.05 of a core idle" in full.detail


def test_gil_contention_needs_flat_scaling_one_busy_core_and_a_held_gil():
    flat = dict(concurrent__throughput_rps=45.0, concurrent__sequential_rps=60.0, concurrent__cpu_cores_busy=1.0, concurrent__gil_wait_p50_ms=5.6,
                concurrent__p50_ms=170.0, p50_ms=16.0)  # fmt: skip
    [f] = diagnose_evidence(healthy(**flat, concurrent__worker_hot_spot="app.py:14 predict (60% of 218 samples)")).findings
    assert f.id == "gil-contention" and "app.py:14" in f.evidence["hot_spot"]
    assert f.saving_ms == pytest.approx(1000 / 45 - 1000 / 120, abs=0.01)
    # native code in parallel: both CPUs busy
    assert diagnose_evidence(healthy(**{**flat, "concurrent__cpu_cores_busy": 1.9})).findings == []
    # threads waiting on I/O or a lock, not running Python: the GIL is free
    assert diagnose_evidence(healthy(**{**flat, "concurrent__gil_wait_p50_ms": 0.1})).findings == []
    # it scales: more than one core's worth ran at once
    assert diagnose_evidence(healthy(**{**flat, "concurrent__throughput_rps": 100.0, "concurrent__cpu_cores_busy": 1.4})).findings == []
    # ... or, on one core's worth, the saving left is under the floor (waits that overlap)
    assert diagnose_evidence(healthy(**{**flat, "concurrent__throughput_rps": 115.0})).findings == []
    # a sequential phase that other work slowed (1.45x "scaling") while the concurrent phase ran
    # one core's worth, its threads waiting for the GIL: still one at a time, sized from the phases
    [slowed] = diagnose_evidence(healthy(**{**flat, "concurrent__throughput_rps": 69.4, "concurrent__sequential_rps": 47.9})).findings
    assert slowed.id == "gil-contention" and slowed.saving_ms == pytest.approx(1000 / 69.4 - 1000 / 95.8, abs=0.01)
    # the Python work is a model built per request: that finding's fix removes it
    built = healthy(**flat, warm__constructed_per_request=4.0, warm__params_built_per_request=264_000.0)
    assert {f.id for f in diagnose_evidence(built).findings} == {"model-load-per-request"}
    # requests too short to tell the endpoint's GIL use from the doctor's own: not checked
    short = diagnose_evidence(healthy(**{**flat, "p50_ms": 1.7}))
    assert short.findings == [] and "too short" in short.not_checked["gil-contention"]
    # one CPU: nothing to run in parallel on
    assert {f.id for f in diagnose_evidence(healthy(**flat, environment__cpus_available=1)).findings} == {"thread-oversubscription"}
    # the core this process left unused was idle: the threads waited on the GIL
    assert [f.id for f in diagnose_evidence(healthy(**flat, concurrent__machine_cores_idle=0.9)).findings] == ["gil-contention"]
    # other processes ran on it: a late thread may have waited for a CPU, not the GIL
    shared = diagnose_evidence(healthy(**flat, concurrent__machine_cores_idle=0.1))
    assert shared.findings == [] and "other processes" in shared.not_checked["gil-contention"]
    # both loads served without the probes: their rates are the ones sized (and judged), one
    # caller's beside N callers', never one of each
    bare = {**flat, "concurrent__served_rps": 50.0, "concurrent__served_alone_rps": 70.0}
    [served] = diagnose_evidence(healthy(**bare)).findings
    assert served.saving_ms == pytest.approx(1000 / 50 - 1000 / 140, abs=0.01) and served.evidence["concurrent_rps"] == 50.0
    assert served.evidence["rates_measured"] == "without the probes" and "without the probes" in served.detail
    [probed] = diagnose_evidence(healthy(**flat, concurrent__served_rps=50.0)).findings  # (no bare run at one caller)
    assert probed.saving_ms == pytest.approx(1000 / 45 - 1000 / 120, abs=0.01) and probed.evidence["rates_measured"] == "under the probes"
    # a probed sequential phase slower than the bare one makes a flat endpoint look scaled: 84
    # req/s at c=8 against a probed 60 alone is 1.4x, against the bare 84 alone 1.0x
    scaled = {**flat, "concurrent__throughput_rps": 84.0, "concurrent__cpu_cores_busy": 1.2}
    assert diagnose_evidence(healthy(**scaled)).findings == []
    [flat_bare] = diagnose_evidence(healthy(**scaled, concurrent__served_rps=84.0, concurrent__served_alone_rps=84.0)).findings
    assert flat_bare.id == "gil-contention" and flat_bare.evidence["scaling"] == 1.0
    # the cores one request keeps busy alone, measured without the sampler and client, come first
    assert diagnose_evidence(healthy(**flat, warm__cpu_cores_busy=1.0, concurrent__served_alone_cores=1.56)).findings == []
    # one request alone already kept 1.56 of the 2 CPUs busy (torch's intra-op threads): more
    # processes could run 1.28 requests at once at most, and the GIL is not what holds them
    assert diagnose_evidence(healthy(**flat, warm__cpu_cores_busy=1.56)).findings == []
    [f] = diagnose_evidence(healthy(**flat, warm__cpu_cores_busy=1.25)).findings  # (1.6 at once: sized so)
    assert f.saving_ms == pytest.approx(1000 / 45 - 1000 / (60 * 2 / 1.25), abs=0.01)
    # one core's worth alone, the doctor's sampler and client beside it: two at once, as before
    [f] = diagnose_evidence(healthy(**flat, warm__cpu_cores_busy=1.1)).findings
    assert f.saving_ms == pytest.approx(1000 / 45 - 1000 / 120, abs=0.01)


def test_gil_contention_quotes_the_users_own_hot_line_with_its_idiom():
    flat = dict(concurrent__throughput_rps=45.0, concurrent__sequential_rps=60.0, concurrent__cpu_cores_busy=1.0, concurrent__gil_wait_p50_ms=5.6,
                concurrent__p50_ms=170.0, p50_ms=16.0)  # fmt: skip
    [plain] = diagnose_evidence(healthy(**flat)).findings
    assert "your own line" not in plain.fix and "ProcessPoolExecutor" in plain.fix
    line = "x = np.array(list(img.getdata()), dtype=np.float32)"
    ev = healthy(**flat, hot_spots={"preprocess": "app.py:21 prepare (70% of 90 samples)"}, hot_lines={"preprocess": line},
                 hot_spots_in_user_code={"preprocess": True})  # fmt: skip
    [f] = [f for f in diagnose_evidence(ev).findings if f.id == "gil-contention"]
    assert line in f.fix and "np.asarray(img" in f.fix and "app.py:21" in f.fix and "ProcessPoolExecutor" in f.fix
    # the same line in a stage that is 1% of the request is not the work that holds the GIL
    ev.stages = {"preprocess": {"mean_ms": 0.1, "p95_ms": 0.2, "share": 0.01}}
    assert [f.fix for f in diagnose_evidence(ev).findings if f.id == "gil-contention"] == [plain.fix]
    # a loop of sums is numbers: numpy; a loop over strings is not, and is not told to use numpy
    sums, grams = "total += math.sqrt(abs(v)) * w", "grams = {w[k:k + 3] for k in range(len(w) - 2)}"
    for text, idiom, not_idiom in ((sums, "np.add.reduce", "at start-up"), (grams, "at start-up", "np.")):
        ev = healthy(**flat, hot_spots={"preprocess": "app.py:21 prepare"}, hot_lines={"preprocess": text}, hot_spots_in_user_code={"preprocess": True})
        [f] = [f for f in diagnose_evidence(ev).findings if f.id == "gil-contention"]
        own = f.fix.split("# the hot spot is Python code")[0]
        assert text in own and idiom in own and not_idiom not in own, f.fix
    # a line no idiom fits: the general fix alone
    ev = healthy(**flat, hot_spots={"preprocess": "app.py:21 prepare"}, hot_lines={"preprocess": "y = self.encode(x)"},
                 hot_spots_in_user_code={"preprocess": True})  # fmt: skip
    assert [f.fix for f in diagnose_evidence(ev).findings if f.id == "gil-contention"] == [plain.fix]


def test_slow_stages_name_the_hot_spot():
    ev = healthy(hot_spots={"serialize": "fastapi/encoders.py:322 jsonable_encoder (46% of 100 samples)"}, p50_ms=10.0)
    ev.stages = {"serialize": {"mean_ms": 8.0, "p95_ms": 9.0, "share": 0.8}, "infer": {"mean_ms": 1.0, "p95_ms": 1.0, "share": 0.1}}
    [f] = diagnose_evidence(ev).findings
    # severity by the doctor's thresholds: 80% of the stage's 8 ms is 64% of the p50
    assert f.id == "slow-serialization" and f.severity == "critical" and (f.saving_basis, f.saving_load) == ("estimated", "c=1")
    assert "jsonable_encoder" in f.evidence["hot_spot"] and "orjson" in f.fix


def test_a_slow_stage_is_judged_and_sized_by_the_median_request_not_a_few_slow_ones():
    ev = healthy(p50_ms=4.0)
    # two requests of 100 ms (a pause) lift the mean to 6.6 ms; the typical request spends 2.6 ms here
    ev.stages = {"preprocess": {"mean_ms": 6.6, "p50_ms": 2.6, "p95_ms": 3.7, "share": 0.81}}
    [f] = diagnose_evidence(ev).findings
    assert f.id == "slow-preprocess" and f.severity == "critical" and f.saving_ms == pytest.approx(2.08)  # (52% of 4 ms)
    assert f.evidence["share"] == pytest.approx(0.65) and "median request" in f.detail
    ev.stages = {"preprocess": {"mean_ms": 6.6, "p50_ms": 0.8, "p95_ms": 1.0, "share": 0.81}}
    assert diagnose_evidence(ev).findings == []  # the median request's share is 20%: not a slow stage


def test_a_stage_share_is_read_request_by_request_where_the_report_kept_its_rows():
    # a busy machine: some requests stall in the forward, some do not, and the stage's time
    # moves with them: its share of each request is the figure, not its p50 over the request's
    rows = [{"total_ms": t, "stages": {"preprocess": p, "infer": t - p}} for p, t in ((3.0, 8.0), (3.2, 8.5), (3.4, 9.0), (4.0, 17.5), (4.4, 18.0), (4.6, 18.5), (5.5, 19.0))]
    shares = stage_shares(rows + [{"total_ms": 0.0, "stages": {}}, {"total_ms": 9.0}])  # (rows with no breakdown: left out)
    assert shares["preprocess"] == pytest.approx(5.5 / 19.0, abs=1e-4) and set(shares) == {"preprocess", "infer"}
    assert stage_shares(rows + [{"total_ms": 10.0, "stages": {"infer": 10.0}}] * 2)["preprocess"] == pytest.approx(4.6 / 18.5, abs=1e-4)  # (none: 0)
    assert stage_shares(rows[:4]) == {}  # too few rows to read a median from
    totals, pre = Distribution(), Distribution()
    totals.extend([r["total_ms"] for r in rows]), pre.extend([r["stages"]["preprocess"] for r in rows])
    report = Report.from_distributions(totals, {"preprocess": pre}, samples=rows)
    report.diagnosis = DoctorSection(evidence=healthy().to_dict())
    ev = Evidence.from_report(report)
    assert ev.stage_shares == shares and ev.p50_ms == pytest.approx(17.5)  # (the stage's p50 over it: 4.0 / 17.5 = 23%)
    [f] = diagnose_evidence(ev).findings
    assert f.id == "slow-preprocess" and f.evidence["share"] == shares["preprocess"] and f.saving_ms == pytest.approx(3.2)  # (80% of its p50)
    ev.stage_shares = {"preprocess": 0.20}
    assert diagnose_evidence(ev).findings == []  # 20% of the typical request, whatever its mean's share (28%)


def test_cold_start_is_paid_once_not_per_request():
    [f] = diagnose_evidence(healthy(cold__latency_ms=900.0, cold__repeat_ms=950.0)).findings
    assert f.saving_per == "first request" and f.saving_ms == pytest.approx(898.0)


def test_a_slow_first_request_is_one_sample_and_must_happen_again_in_a_fresh_process():
    once = diagnose_evidence(healthy(cold__latency_ms=900.0))
    assert once.findings == [] and "one sample" in once.not_checked["cold-start"]
    noise = diagnose_evidence(healthy(cold__latency_ms=900.0, cold__repeat_ms=4.0, cold__repeat_p50_ms=2.0))
    assert noise.findings == [] and "cold-start" not in noise.not_checked
    # inside the warm requests' own tail: not a cold start, however slow against the p50
    assert diagnose_evidence(healthy(cold__latency_ms=900.0, cold__repeat_ms=950.0, warm__max_ms=800.0)).findings == []


def test_a_lazy_load_is_sized_by_what_a_warm_up_would_take_off_the_first_request():
    ev = healthy(cold__latency_ms=900.0, cold__loads=2, cold__load_calls=["from_pretrained"])
    ev.cold.stage_ms = {"load": 700.0, "infer": 60.0, "validate": 120.0, "network+client": 18.0}
    ev.stages = {"infer": {"mean_ms": 1.0, "p95_ms": 1.2, "share": 0.5}}
    [f] = diagnose_evidence(ev).findings
    # the load and the first forward's extra; not the framework's first-request validation
    assert f.id == "cold-start" and f.saving_ms == pytest.approx(759.0) and f.evidence["loaded_on_first_request"] is True
    assert f.evidence["first_request_load_calls"] == "from_pretrained"
    # loads on every request too: the cold request's load is no cold start, and names none
    ev.warm.loads_per_request = 2.0
    assert "cold-start" not in {f.id for f in diagnose_evidence(ev).findings}


def test_savings_that_every_request_pays_never_add_up_to_more_than_the_request():
    ev = healthy(warm__loads_per_request=2, warm__load_ms_per_request=15.0, p50_ms=20.0, cold__latency_ms=900.0, cold__repeat_ms=900.0)
    ev.stages = {"postprocess": {"mean_ms": 12.0, "p95_ms": 13.0, "share": 0.6}}
    findings = diagnose_evidence(ev).findings
    per_request = [f.saving_ms for f in findings if f.saving_per == "request" and f.saving_ms]
    assert sum(per_request) == pytest.approx(20.0, abs=0.01) and len(per_request) == 2
    post = next(f for f in findings if f.id == "slow-postprocess")
    assert post.saving_ms == pytest.approx(9.6 * 20 / 24.6, abs=0.01) and "Alone it would save about 9.6 ms" in post.detail
    assert next(f for f in findings if f.id == "cold-start").saving_ms > 20  # once, not capped per request


def test_a_scaled_saving_ranks_its_finding_again():

    a = Finding("no-batching", "critical", "A", saving_ms=90.0)
    b = Finding("grad-enabled", "high", "B", saving_ms=20.0)
    c = Finding("slow-postprocess", "high", "C", saving_ms=30.0)  # ranked by its share of the request
    cap_savings([a, b, c], 60.0)
    assert (a.saving_ms, b.saving_ms, c.saving_ms) == (38.571, 8.571, 12.857)
    assert (a.severity, b.severity, c.severity) == ("critical", "medium", "high")


def test_findings_of_one_severity_are_listed_by_their_share_of_the_request_at_their_own_load():
    # the per-row forest: 54 ms of a 62-ms request at one client, 120 ms of a 240-ms one at eight
    items = Finding("per-item-calls", "critical", "items", saving_ms=54.0, saving_load="c=1")
    batching = Finding("no-batching", "critical", "batching", saving_ms=120.0, saving_load="c=8")
    cold = Finding("cold-start", "critical", "cold", saving_ms=900.0, saving_per="first request", saving_load="first request")
    cap_savings([items, batching, cold], 62.0, {"c=8": 240.0})
    assert (items.saving_share, batching.saving_share, cold.saving_share) == (0.871, 0.5, None)
    report = Report(latency={"count": 30, "p50_ms": 62.0}, stages={}, environment={}, findings=[cold, batching, items])
    assert [f.id for f in report.findings_by_severity()] == ["per-item-calls", "no-batching", "cold-start"]
    assert Finding.from_dict(items.to_dict()).saving_share == 0.871  # (kept in the saved report)
    # a measured saving keeps the share of the p50 its own blocks measured (the concurrent
    # phase, probed and sampled, ran slower than the blocks)
    measured = Finding("no-batching", "high", "b", saving_ms=41.9, saving_load="c=8", saving_basis="measured", saving_share=0.5456)
    cap_savings([measured], 12.0, {"c=8": 103.4})
    assert measured.saving_share == 0.5456


def test_savings_at_concurrency_are_capped_by_the_p50_the_experiments_blocks_served_not_the_probed_phases():
    from servescope.rules import _served_p50

    ev = healthy()
    ev.concurrent.concurrency, ev.concurrent.p50_ms = 8, 103.0  # (the probed, sampled phase)
    ev.experiments = {
        "batching": WhatIf(fix="b", tried=True, concurrency=8, base_p50_ms=77.0, saving_ms=40.0),
        "off-the-loop": WhatIf(fix="o", tried=True, concurrency=8, base_p50_ms=75.0, saving_ms=60.0),
        "memoise-loaders": WhatIf(fix="m", tried=True, concurrency=1, base_p50_ms=9.0, saving_ms=1.0),
        "processes": WhatIf(fix="p", tried=False, concurrency=8, base_p50_ms=300.0),
    }
    assert _served_p50(ev, 8, "latency") == 77.0 and _served_p50(ev, 8, "first chunk") is None
    batching = Finding("no-batching", "high", "b", saving_ms=40.0, saving_load="c=8", saving_basis="measured")
    loop = Finding("event-loop-blocked", "high", "l", saving_ms=60.0, saving_load="c=8", saving_basis="measured")
    cap_savings([batching, loop], 2.0, {"c=8": _served_p50(ev, 8, "latency")})
    assert batching.saving_ms + loop.saving_ms == pytest.approx(77.0, abs=0.01)  # (against 103, they would pass uncapped)
    from servescope.rules import p50_at_loads

    assert p50_at_loads(ev) == {"c=1": ev.p50_ms, "c=8": 77.0}
    # the concurrent load run again without the probes and the sampler comes first
    ev.concurrent.served_p50_ms, ev.concurrent.first_chunk_p50_ms, ev.concurrent.served_first_chunk_p50_ms = 70.0, 50.0, 30.0
    assert p50_at_loads(ev) == {"c=1": ev.p50_ms, "c=8": 70.0, "c=8, first chunk": 30.0}


def test_rules_without_evidence_are_listed_as_not_checked():
    ev = Evidence(target_kind="url", cold=Cold(latency_ms=3.0), warm=Warm(requests=30, p50_ms=2.0), p50_ms=2.0)
    ev.missing["environment"] = "the server's CPUs are not visible from outside"
    ev.probes_at_fault = "there are no probes from outside the process (--url)"
    d = diagnose_evidence(ev)
    assert d.findings == []
    assert d.not_checked["thread-oversubscription"] == "the server's CPUs are not visible from outside"
    assert "no probes" in d.not_checked["model-load-per-request"]
    assert set(d.not_checked) >= {"no-batching", "event-loop-blocked", "gil-contention", "training-mode", "grad-enabled"}


def test_a_rule_with_a_bug_is_not_silently_skipped():
    ev = healthy()
    ev.warm.loads_per_request = "2"  # a wrong type reaching a rule is a bug: it must be loud
    with pytest.raises(TypeError):
        model_load_per_request(ev)
    with pytest.raises(MissingEvidence):
        no_batching(healthy(concurrent=None))


def test_evidence_round_trips_through_a_saved_report(tmp_path):
    ev = healthy(concurrent__loop=LoopActivity(samples=10, busy_samples=2, busy_share=0.2, longest_busy_ms=4.0))
    rep = Report(latency={"count": 30, "p50_ms": 2.0}, stages={}, environment={})
    rep.extra["evidence"] = ev.to_dict()
    rep.save(tmp_path / "r.json")
    back = Evidence.from_report(Report.load(tmp_path / "r.json"))
    assert back.to_dict() == ev.to_dict() and back.p50_ms == 2.0
    assert diagnose_report(Report.load(tmp_path / "r.json")) == []


def test_evidence_of_the_wrong_type_is_refused_with_where():
    data = healthy().to_dict()
    data["warm"]["requests"] = "thirty"
    with pytest.raises(ReportError, match="evidence.warm.requests"):
        Evidence.from_dict(data)


def test_a_report_from_an_older_doctor_loads_with_defaults():
    rep = Report(latency={"count": 30, "p50_ms": 2.0}, stages={}, environment={})
    rep.extra["evidence"] = {"target_kind": "function", "cold": {"latency_ms": 3.0}, "warm": {"requests": 30}}
    d = diagnose_report(rep)
    assert d == [] and "no-batching" in rep.extra["not_checked"]


def test_repeated_work_needs_the_same_inputs_in_every_request_and_a_varied_one():
    ev = healthy(repeated=Repeated(calls_per_request=1, ms_per_request=900.0, modules=["BertModel"], batch_sizes=[200]), p50_ms=1000.0)
    [f] = diagnose_evidence(ev).findings
    assert (f.id, f.severity, f.saving_ms) == ("repeated-work", "critical", 900.0) and "start-up" in f.fix
    ev = healthy(repeated=None)
    ev.missing["repeated"] = "a request with the payload varied failed (HTTP 422)"
    assert "HTTP 422" in diagnose_evidence(ev).not_checked["repeated-work"]


def test_padding_waste_from_the_attention_mask():
    ev = healthy(warm__forwards=forwards(pad_share=0.9, mean_ms=10.0, padding_ms_per_request=9.0), p50_ms=12.0)
    [f] = diagnose_evidence(ev).findings
    assert f.id == "padding-waste" and f.saving_ms == pytest.approx(9.0) and "padding=True" in f.fix
    assert diagnose_evidence(healthy(warm__forwards=forwards(pad_share=0.2, mean_ms=10.0))).findings == []


def test_every_rule_is_registered_once():
    assert len(RULES) == len(set(RULES.values())) == 19


def test_a_saving_measured_by_trying_the_fix_replaces_the_estimate():
    ev = healthy(warm__loads_per_request=2, warm__load_ms_per_request=15.0, p50_ms=40.0)
    ev.experiments["memoise-loaders"] = WhatIf(
        fix="loaders answered from memory", tried=True, pairs=6, base_p50_ms=41.0, fixed_p50_ms=8.0,
        saving_ms=33.0, low_ms=30.0, high_ms=36.0, answers="same",
    )  # fmt: skip
    [f] = diagnose_evidence(ev).findings
    assert (f.saving_ms, f.saving_basis, f.saving_load, f.saving_low_ms, f.saving_high_ms) == (33.0, "measured", "c=1", 30.0, 36.0)
    assert f.severity == "critical" and "Measured by trying the fix" in f.detail and "41 -> 8" in f.detail
    assert f.evidence["load_ms_per_request"] == 15.0  # the probes' own figure stays in the evidence


def test_a_busy_machine_whose_speed_moved_between_the_phases_is_said_not_glossed():
    """On a shared machine a torch endpoint's speed swings 10x: the blocks alternated, so the
    saving holds at their speed, but not for a request as slow as the endpoint was on its own.
    The report says so, with the share and what it is at the other speed."""
    ev = healthy(warm__loads_per_request=2, warm__load_ms_per_request=15.0, p50_ms=900.0)
    ev.experiments["memoise-loaders"] = WhatIf(
        fix="loaders answered from memory", tried=True, pairs=6, base_p50_ms=100.0, fixed_p50_ms=25.0,
        saving_ms=75.0, low_ms=70.0, high_ms=80.0, answers="same", others_cores=0.9,
    )  # fmt: skip
    [f] = diagnose_evidence(ev).findings
    assert f.saving_ms == 75.0 and f.saving_basis == "measured" and f.severity == "critical"  # (75% of the request)
    assert "ran at p50 100 ms in these blocks but 900 ms when measured on its own (9.0x)" in f.detail
    assert "75% of the request: about 675 ms at the other speed" in f.detail and "the difference holds" not in f.detail
    ev.p50_ms = 120.0  # the same speed in both: the alternation holds, and that is all there is to say
    [f] = diagnose_evidence(ev).findings
    assert "these blocks but" not in f.detail and "since their blocks alternated, the difference holds" in f.detail


def test_a_measured_saving_that_may_be_zero_ranks_by_the_low_end_of_its_interval():
    ev = healthy(warm__forwards=forwards(grad=30))
    ev.experiments["inference-mode"] = WhatIf(fix="f", tried=True, pairs=8, base_p50_ms=2.0, fixed_p50_ms=1.7, saving_ms=0.3, low_ms=-0.1, high_ms=0.7)
    [f] = diagnose_evidence(ev).findings
    assert f.saving_ms == 0.3 and f.severity == "info" and "cannot be told from none" in f.detail


def test_a_fix_that_could_not_be_tried_says_why_and_keeps_the_estimate():
    ev = healthy(warm__loads_per_request=2, warm__load_ms_per_request=15.0, p50_ms=20.0)
    ev.experiments["memoise-loaders"] = WhatIf(fix="f", why_not="the answers changed with the fix (for example [1])")
    [f] = diagnose_evidence(ev).findings
    assert f.saving_ms == 15.0 and f.saving_basis == "estimated" and "not tried on the endpoint: the answers changed" in f.detail


def test_a_fix_that_gains_nothing_measured_says_so_and_ranks_by_what_else_it_costs():
    on_loop = healthy(concurrent__forwards=forwards(count=48, on_event_loop=48, batch_sizes=[1, 8], max_batch=8), concurrent__p50_ms=90.0)
    on_loop.concurrent.loop = LoopActivity(samples=100, busy_samples=90, busy_share=0.9, longest_busy_ms=120.0)
    on_loop.experiments["off-the-loop"] = WhatIf(
        fix="off", tried=True, concurrency=8, pairs=3, base_p50_ms=90.0, fixed_p50_ms=95.0, saving_ms=-5.0, low_ms=-20.0, high_ms=10.0,
        base_rps=60.0, fixed_rps=66.0,
    )  # fmt: skip
    [f] = diagnose_evidence(on_loop).findings
    assert f.id == "event-loop-blocked" and f.saving_ms is None and "no gain" in f.detail
    assert f.severity == "medium" and "120 ms at a stretch" in f.detail  # a health check waits that long
    # more requests a second, the median wait no lower: not "nothing faster"
    assert "does not lower the p50 here, though it served 1.10x the requests a second" in f.detail
    on_loop.experiments["off-the-loop"].fixed_rps = 63.0  # (within the blocks' noise)
    [f] = diagnose_evidence(on_loop).findings
    assert "does not make this endpoint faster" in f.detail
    on_loop.experiments["off-the-loop"].fixed_rps = 72.0
    [f] = diagnose_evidence(on_loop).findings
    assert "does not lower the p50 here, though it served 1.20x the requests a second" in f.detail
    assert "does not make this endpoint faster" not in f.detail


def test_savings_at_different_loads_are_capped_apart():
    a = Finding("model-load-per-request", "critical", "A", saving_ms=15.0, saving_load="c=1")
    b = Finding("no-batching", "critical", "B", saving_ms=70.0, saving_load="c=8")
    cap_savings([a, b], 20.0, {"c=8": 100.0})
    assert (a.saving_ms, b.saving_ms) == (15.0, 70.0)
    c = Finding("slow-postprocess", "high", "C", saving_ms=30.0, saving_load="c=8")
    cap_savings([b, c], 20.0, {"c=8": 80.0})
    assert b.saving_ms + c.saving_ms == pytest.approx(80.0, abs=0.01)


def test_an_estimate_gets_only_what_a_measured_saving_leaves_of_the_request():
    measured = Finding("model-load-per-request", "critical", "M", saving_ms=30.0, saving_basis="measured", saving_load="c=1")
    guess = Finding("slow-postprocess", "high", "G", saving_ms=30.0, saving_basis="estimated", saving_load="c=1")
    cap_savings([measured, guess], 40.0)
    assert measured.saving_ms == 30.0 and guess.saving_ms == pytest.approx(10.0)


def test_threads_beyond_the_cpus_other_processes_leave_free_are_a_misfit_when_fewer_measurably_win():
    from servescope.doctor.evidence import Machine

    busy = healthy(machine=Machine(cpus_available=2, others_cores=1.1, busy=True))
    # a neighbour comes and goes: without fewer threads measured faster, nothing is claimed
    assert diagnose_evidence(busy).findings == []
    busy.experiments["torch-threads"] = WhatIf(fix="torch.set_num_threads(1)", tried=True, pairs=4, base_p50_ms=60.0, fixed_p50_ms=12.0,
                                               saving_ms=48.0, low_ms=40.0, high_ms=56.0)  # fmt: skip
    [f] = diagnose_evidence(busy).findings
    assert f.id == "thread-oversubscription" and "left free by other processes (0.9 of 2)" in f.title
    assert f.evidence["cpus_free"] == 0.9 and "torch.set_num_threads(1)" in f.fix
    assert (f.saving_ms, f.saving_basis, f.severity) == (48.0, "measured", "critical")
    assert "OMP_WAIT_POLICY" not in f.fix  # (no OpenMP runtime was seen loaded)
    # OpenMP's default wait (spinning first): the policy that keeps the threads is offered too
    busy.environment.omp_wait_policy = "default"
    [f] = diagnose_evidence(busy).findings
    assert "OMP_WAIT_POLICY=PASSIVE" in f.fix and "not tried by the doctor" in f.fix and "torch.set_num_threads(1)" in f.fix
    busy.environment.omp_wait_policy = "OMP_WAIT_POLICY=ACTIVE"  # the user's own: not second-guessed
    assert "PASSIVE" not in diagnose_evidence(busy).findings[0].fix
    # fewer threads won nothing measurable: the pool is no misfit here
    busy.experiments["torch-threads"].low_ms = -3.0
    assert diagnose_evidence(busy).findings == []
    # a quiet machine, 2 threads on 2 CPUs: nothing to say
    assert diagnose_evidence(healthy(machine=Machine(cpus_available=2, others_cores=0.1))).findings == []


def test_an_onnx_runtime_pool_too_big_for_the_cpus_left_free_gets_the_saving_measured_with_fewer():
    from servescope.doctor.evidence import Machine

    # three pools of one size: the one fewer threads measurably beat is named
    env = Environment(torch_threads=2, blas_threads=2, ort_threads=2, cpus_available=2)
    busy = healthy(machine=Machine(cpus_available=2, others_cores=1.1, busy=True), environment=env)
    assert diagnose_evidence(busy).findings == []
    busy.experiments["ort-threads"] = WhatIf(fix="intra_op_num_threads = 1", tried=True, pairs=6, base_p50_ms=30.0, fixed_p50_ms=20.0,
                                             saving_ms=10.0, low_ms=8.0, high_ms=12.0)  # fmt: skip
    busy.experiments["torch-threads"] = WhatIf(fix="torch", tried=True, pairs=6, base_p50_ms=30.0, fixed_p50_ms=30.5,
                                               saving_ms=-0.5, low_ms=-2.0, high_ms=1.0)  # fmt: skip
    [f] = diagnose_evidence(busy).findings
    assert f.id == "thread-oversubscription" and "intra_op_num_threads = 1" in f.fix and f.saving_basis == "measured" and f.saving_ms == 10.0
    # a win on three pairs (an interval at 75%) is not one to name a misfit by
    busy.experiments["ort-threads"].coverage = 0.75
    assert diagnose_evidence(busy).findings == []


def test_the_thread_count_tried_is_what_the_cpus_really_free_allow():
    from servescope.doctor.evidence import Machine
    from servescope.doctor.experiments.threads import thread_target

    assert thread_target(healthy(machine=Machine(others_cores=1.0))) == 1
    assert thread_target(healthy(machine=Machine(others_cores=0.0))) is None  # 2 threads on 2 free CPUs
    assert thread_target(healthy(environment=Environment(torch_threads=8, cpus_available=4, workers=2))) == 2


@pytest.mark.parametrize(
    "calls, says, not_says",
    [
        (["onnxruntime.InferenceSession()"], "onnxruntime.InferenceSession(", "torch.load"),
        (["joblib.load"], "joblib.load(PATH)", "torch.load"),
        (["AutoTokenizer.from_pretrained"], "AutoTokenizer.from_pretrained(PATH)", "torch.load"),
        (["load_state_dict", "torch.load"], "torch.load(PATH", "joblib"),
        ([], "build_model()", "joblib"),  # a model built per request, no loader call
    ],
)
def test_the_load_once_fix_is_written_for_what_the_endpoint_loads(calls, says, not_says):
    ev = healthy(warm__loads_per_request=1, warm__load_ms_per_request=5.0, warm__load_calls=calls, p50_ms=10.0)
    if not calls:
        ev = healthy(warm__constructed_per_request=3.0, warm__params_built_per_request=2570.0, p50_ms=10.0)
    [f] = diagnose_evidence(ev).findings
    assert says in f.fix and not_says not in f.fix
    compile(f.fix, "<fix>", "exec")  # it is Python


@pytest.mark.parametrize(
    "kinds, batch_says, warm_says, not_says",
    [
        (["scikit-learn"], "MODEL.predict_proba(np.vstack(rows))", "MODEL.predict(example_rows)", "torch"),
        (["onnxruntime"], "np.concatenate(rows)", "SESSION.run(None", "torch"),
        (["sentence-transformers"], "MODEL.encode(all_texts, batch_size=32)", 'MODEL.encode(["warm-up"])', "torch"),
        (["torch"], "torch.stack(inputs)", "torch.inference_mode()", "joblib"),
    ],
)
def test_the_batching_and_warm_up_fixes_are_written_for_the_stack_seen(kinds, batch_says, warm_says, not_says):
    from servescope.rules.idioms import batch_fix, warmup_fix

    for fix, says in ((batch_fix(kinds), batch_says), (warmup_fix(kinds), warm_says)):
        assert says in fix and not_says not in fix.replace("servescope", "")
        compile(fix, "<fix>", "exec")  # it is Python


@pytest.mark.parametrize(
    "kinds, calls, says, not_says",
    [
        (["scikit-learn"], ["TfidfVectorizer.transform"], "FIXED = tfidf_vectorizer.transform(FIXED_INPUT)", "embed"),
        (["scikit-learn"], ["XGBClassifier.predict_proba"], "xgb_classifier.predict_proba(", "torch"),
        (["onnxruntime"], ["InferenceSession.run"], "session.run(None, fixed_feed)", "torch"),
        (["sentence-transformers", "torch"], ["SentenceTransformer.encode"], "model.encode(CORPUS", "inference_mode"),
        (["torch"], [], "torch.inference_mode()", "encode"),
    ],
)
def test_the_compute_once_fix_names_the_call_that_repeats_in_its_own_library(kinds, calls, says, not_says):
    from servescope.rules.idioms import repeated_fix

    fix = repeated_fix(kinds, calls)
    assert says in fix and not_says not in fix
    compile(fix, "<fix>", "exec")


def test_a_vectorisers_batch_is_its_texts_in_one_call_not_stacked_rows():
    from servescope.rules.idioms import batch_fix

    fix = batch_fix(["scikit-learn"], ["TfidfVectorizer.transform", "RandomForestClassifier.predict_proba"])
    assert "tfidf_vectorizer.transform(all_texts)" in fix and "random_forest_classifier.predict_proba(np.vstack(rows))" in fix
    assert "forest" not in fix.split("random_forest")[0]
    compile(fix, "<fix>", "exec")


def test_a_pipeline_given_dataframes_is_batched_as_frames_not_stacked_arrays():
    from servescope.rules.idioms import batch_fix
    from servescope.rules.items import _fix

    # a ColumnTransformer selects columns by name: np.vstack of one-row frames loses the names
    for fix in (batch_fix(["scikit-learn"], ["Pipeline.predict_proba"], frames=True), _fix(["scikit-learn"], ["Pipeline.predict_proba"], frames=True)):
        assert "np.vstack" not in fix and ("pd.concat(frames)" in fix or "model.predict_proba(frame)" in fix)
        compile(fix, "<fix>", "exec")
    assert "np.vstack(rows)" in _fix(["scikit-learn"], ["Pipeline.predict_proba"])  # (arrays: stacked, as before)


def test_a_batching_gain_found_on_fewer_threads_says_so():
    from servescope.doctor.evidence import BatchProbe
    from servescope.rules.concurrency import _fewer_threads_note

    probe = BatchProbe(per_item_ms={"1": 0.6, "16": 0.1}, best_batch=16, gain=6.0)
    assert _fewer_threads_note(probe) == ""
    probe.fewer_threads, probe.per_item_ms_fewer_threads = 1, {"1": 0.7, "16": 0.1}
    assert "torch.set_num_threads(1)" in _fewer_threads_note(probe)
    probe.per_item_ms_fewer_threads = {"1": 0.7, "16": 0.4}  # the default pool was the faster: nothing to say
    assert _fewer_threads_note(probe) == ""


def test_a_loop_stopped_in_a_blocking_wait_is_blocked_and_sized_by_what_the_others_waited():
    waits = LoopActivity(samples=500, busy_samples=2, busy_share=0.004, longest_busy_ms=4.0, waiting_share=0.97, longest_wait_ms=1500.0,
                         waiting_in="app.py:22 generate (in transformers/generation/streamers.py:226 __next__) (99% of the time, 500 samples)")  # fmt: skip
    streamed = healthy(concurrent__loop=waits, concurrent__loop_lag_max_ms=1800.0, concurrent__first_chunk_p50_ms=1585.0,
                       warm__first_chunk_p50_ms=4.0)  # fmt: skip
    [f] = diagnose_evidence(streamed).findings
    assert f.id == "event-loop-blocked" and "blocking wait" in f.title and "app.py:22 generate" in f.evidence["waiting_in"]
    assert f.saving_ms == pytest.approx(1581.0) and f.saving_basis == "estimated" and "first chunk" in f.saving_load
    assert "def tokens():" in f.fix and "AsyncTextIteratorStreamer" in f.fix
    # the selector's wait (an idle loop) is not a blocking wait; nor a short one, nor one no task felt
    assert diagnose_evidence(healthy(concurrent__loop=LoopActivity(samples=500, waiting_share=0.0), concurrent__loop_lag_max_ms=1800.0)).findings == []
    short = LoopActivity(samples=500, waiting_share=0.9, longest_wait_ms=8.0)
    assert diagnose_evidence(healthy(concurrent__loop=short, concurrent__loop_lag_max_ms=1800.0)).findings == []
    assert diagnose_evidence(healthy(concurrent__loop=waits, concurrent__loop_lag_max_ms=3.0)).findings == []


def test_a_saving_measured_by_throughput_says_it_is_the_mean_a_request_spends():
    # the off-the-loop fix at c=8 beside a neighbour (docs/benchmarks.md, session 30): each
    # block's callers over its throughput; the finding says what its figures are
    on_loop = healthy(concurrent__forwards=forwards(count=48, on_event_loop=48, batch_sizes=[1, 8], max_batch=8), concurrent__p50_ms=130.0)
    on_loop.concurrent.loop = LoopActivity(samples=100, busy_samples=90, busy_share=0.9, longest_busy_ms=120.0)
    on_loop.experiments["off-the-loop"] = WhatIf(
        fix="off", tried=True, concurrency=8, pairs=8, measure="mean", base_p50_ms=141.1, fixed_p50_ms=125.0, saving_ms=16.2,
        low_ms=12.0, high_ms=19.0, coverage=0.93, base_rps=56.7, fixed_rps=64.0,
    )  # fmt: skip
    [f] = diagnose_evidence(on_loop).findings
    assert f.id == "event-loop-blocked" and f.saving_ms == 16.2 and f.saving_basis == "measured" and f.saving_load == "c=8"
    assert "mean time a request spends (its callers over the throughput, as a steady load keeps it) 141 -> 125 ms at c=8" in f.detail
