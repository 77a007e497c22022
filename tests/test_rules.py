"""Each rule on hand-made reports: fires on its evidence, stays quiet on a healthy one."""

from __future__ import annotations

import copy

import pytest

from servescope.report import Report
from servescope.rules import RULES, diagnose_report


def forwards(**over):
    base = {
        "count": 30, "per_request": 1, "batch_sizes": [1], "max_batch": 1, "training": 0,
        "training_changes_output": 0, "grad": 0, "on_event_loop": 0, "param_devices": ["cpu"],
        "input_devices": ["cpu"], "mean_ms": 1.0, "modules": ["Sequential"],
    }  # fmt: skip
    return {**base, **over}


HEALTHY = {
    "target_kind": "function",
    "cold": {"latency_ms": 3.0, "error": None, "loads": 0, "constructed": 0, "load_calls": []},
    "warm": {
        "requests": 30, "errors": 0, "p50_ms": 2.0, "loads_per_request": 0, "load_ms_per_request": 0.0,
        "load_calls": [], "constructed_per_request": 0, "construct_ms_per_request": 0.0,
        "module_moves_per_request": 0, "h2d_per_request": 1, "d2h_per_request": 1, "small_copies_per_request": 0,
        "unpinned_async_per_request": 0, "syncs_per_request": 1, "copy_bytes_per_request": 4096,
        "forwards": forwards(), "errors_sample": [],
    },
    "concurrent": {
        "concurrency": 8, "requests": 48, "errors": 0, "throughput_rps": 900, "sequential_rps": 500, "p50_ms": 8,
        "forwards": forwards(batch_sizes=[1, 4, 8], max_batch=8), "loop_lag_max_ms": 3.0, "loop_lag_p99_ms": 1.0,
    },
    "batch_probe": {"per_item_ms": {"1": 1.0, "8": 0.2}, "best_batch": 8, "gain": 5.0, "grad_ratio": 1.0, "train_ratio": 1.0, "forward_ms": 1.0},
    "environment": {"cuda_available": False, "torch_threads": 2, "cpus_available": 2, "workers": 1},
    "hot_spots": {},
}  # fmt: skip


def report(evidence=None, stages=None, p50=2.0):
    rep = Report(
        latency={"count": 30, "p50_ms": p50, "mean_ms": p50, "p95_ms": p50 * 1.5, "first_ms": 3.0},
        stages=stages or {},
        environment={},
    )
    rep.extra["evidence"] = evidence or copy.deepcopy(HEALTHY)
    return rep


def with_(path: str, value):
    ev = copy.deepcopy(HEALTHY)
    node = ev
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return ev


def ids(rep):
    return {(f.id, f.severity) for f in diagnose_report(rep)}


def test_a_healthy_endpoint_comes_out_clean():
    assert diagnose_report(report()) == []


@pytest.mark.parametrize(
    "evidence, expected",
    [
        (with_("warm.loads_per_request", 2), ("model-load-per-request", "info")),
        (with_("cold.latency_ms", 900.0), ("cold-start", "high")),
        (with_("warm.module_moves_per_request", 1), ("repeated-transfer", "info")),
        (with_("warm.small_copies_per_request", 12), ("repeated-transfer", "info")),
        (with_("warm.forwards", forwards(training=30, training_changes_output=30)), ("training-mode", "high")),
        (with_("warm.forwards", forwards(grad=30)), ("grad-enabled", "info")),
        (with_("environment", {"cuda_available": False, "torch_threads": 8, "cpus_available": 2, "workers": 1}), ("thread-oversubscription", "high")),
    ],
)
def test_each_cause_fires_on_its_evidence(evidence, expected):
    assert ids(report(evidence)) == {expected}


def test_load_per_request_is_sized_by_what_it_costs():
    ev = with_("warm.loads_per_request", 2)
    ev["warm"]["load_ms_per_request"] = 15.0
    [f] = diagnose_report(report(ev, p50=20.0))
    assert f.id == "model-load-per-request" and f.severity == "critical" and f.saving_ms == 15.0
    assert "torch.load" in f.fix or "load once" in f.fix


def test_no_batching_needs_concurrency_at_batch_one_and_a_real_gain():
    ev = with_("concurrent.forwards", forwards(count=48))  # each of the 48 requests ran its own
    [f] = diagnose_report(report(ev))
    assert f.id == "no-batching" and f.severity == "high"  # saves 0.8 of 2 ms
    assert f.saving_ms == pytest.approx(0.8)
    # a runtime batching on its worker, running only the odd lone request in its own context
    assert diagnose_report(report(with_("concurrent.forwards", forwards(count=3)))) == []
    tiny = copy.deepcopy(ev)
    tiny["batch_probe"]["per_item_ms"] = {"1": 0.05, "8": 0.01}
    assert diagnose_report(report(tiny, p50=0.4)) == []  # batching would not move it


def test_grad_enabled_is_sized_by_the_probe():
    ev = with_("warm.forwards", forwards(grad=30))
    ev["batch_probe"]["grad_ratio"] = 1.5
    [f] = diagnose_report(report(ev))
    assert f.severity == "medium" and f.saving_ms == pytest.approx(1 / 3, abs=1e-3)


def test_model_on_cpu_with_a_gpu_available():
    ev = with_("environment.cuda_available", True)
    assert ids(report(ev)) == {("model-not-on-accelerator", "high")}
    ev["warm"]["forwards"]["param_devices"] = ["cuda:0"]
    assert diagnose_report(report(ev)) == []


def test_event_loop_blocked_needs_the_model_on_the_loop_or_a_long_stall():
    on_loop = with_("concurrent.forwards", forwards(on_event_loop=48, batch_sizes=[1, 8], max_batch=8))
    on_loop["concurrent"]["loop_lag_max_ms"] = 12.0
    assert ids(report(on_loop)) == {("event-loop-blocked", "medium")}
    # servescope.serve runs a lone request on the loop when nothing else waits: not a block
    lone = with_("concurrent.forwards", forwards(on_event_loop=3, batch_sizes=[1, 8], max_batch=8))
    lone["concurrent"]["loop_lag_max_ms"] = 12.0
    assert diagnose_report(report(lone)) == []
    gil_noise = with_("concurrent.loop_lag_max_ms", 30.0)  # lag without the model on the loop
    assert diagnose_report(report(gil_noise)) == []
    stall = with_("concurrent.loop_lag_max_ms", 250.0)
    assert ids(report(stall)) == {("event-loop-blocked", "high")}


def test_slow_stages_name_the_hot_spot():
    ev = with_("hot_spots", {"serialize": "fastapi/encoders.py:322 jsonable_encoder (46% of 100 samples)"})
    stages = {"serialize": {"mean_ms": 8.0, "p95_ms": 9.0, "share": 0.8}, "infer": {"mean_ms": 1.0, "p95_ms": 1.0, "share": 0.1}}
    [f] = diagnose_report(report(ev, stages=stages, p50=10.0))
    assert f.id == "slow-serialization" and f.severity == "high"
    assert "jsonable_encoder" in f.evidence["hot_spot"] and "orjson" in f.fix


def test_rules_survive_a_report_without_evidence():
    rep = Report(latency={"count": 1, "p50_ms": 1.0}, stages={}, environment={})
    rep.extra["evidence"] = {}
    assert diagnose_report(rep) == []


def test_every_rule_is_registered_once():
    assert len(RULES) == len(set(RULES)) == 10
