"""The probes, on real torch code on the CPU (the meta device stands in for a GPU)."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
import torch

from servescope import WallClock, stage, trace
from servescope.doctor.attribution import split_other, stage_windows
from servescope.doctor.probes import Probes, new_evidence, reset_evidence, set_evidence


def run_probed(fn, *args):
    ev = new_evidence()
    with Probes():
        token = set_evidence(ev)
        try:
            with trace() as t:
                out = fn(*args)
        finally:
            reset_evidence(token)
    return t, ev, out


def test_copies_to_a_device_are_counted_with_bytes_and_pinning():
    x = torch.ones(8, 16)

    def handler():
        parts = [x[i].to("meta", non_blocking=True) for i in range(8)]  # eight small copies
        x.to(torch.float64)  # a dtype change is not a copy between devices
        return parts

    t, ev, _ = run_probed(handler)
    assert ev["h2d"] == 8 and ev["small_copies"] == 8
    assert ev["copy_bytes"] == 8 * 16 * 4
    assert ev["unpinned_async"] == 8  # non_blocking from pageable memory is not asynchronous
    assert "to_device" in t.durations_ms


def test_forward_flags_batch_training_grad_and_device():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))  # training by default

    def handler():
        return model(torch.ones(3, 4))

    t, ev, _ = run_probed(handler)
    [fwd] = ev["forwards"]  # the outermost call only, not each submodule
    assert fwd["batch"] == 3 and fwd["training"] and fwd["training_changes_output"] and fwd["grad"]
    assert fwd["param_device"] == "cpu" and fwd["on_event_loop"] is False
    assert "infer" in t.durations_ms

    model.eval()

    def handler2():
        with torch.inference_mode():
            return model(torch.ones(1, 4))

    _, ev2, _ = run_probed(handler2)
    assert not ev2["forwards"][0]["training"] and not ev2["forwards"][0]["grad"]


def test_a_forward_on_an_event_loop_is_seen():
    model = torch.nn.Linear(2, 2)

    async def handler():
        return model(torch.ones(1, 2))

    _, ev, _ = run_probed(lambda: asyncio.run(handler()))
    assert ev["forwards"][0]["on_event_loop"] is True


def test_loading_and_construction_are_counted():
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(4, 4).state_dict(), buf)

    def handler():
        m = torch.nn.Linear(4, 4)
        m.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
        return m

    t, ev, _ = run_probed(handler)
    assert ev["loads"] == 2 and ev["constructed"] >= 1
    assert [label for label, _ in ev["load_calls"]] == ["torch.load", "load_state_dict"]
    assert "load" in t.durations_ms


def test_json_is_serialize_and_validate_and_recursion_is_one_stage():
    def handler():
        payload = json.loads('{"a": [1, 2, 3]}')
        return json.dumps(payload)

    t, _, _ = run_probed(handler)
    assert {"validate", "serialize"} <= set(t.durations_ms)


def test_probes_are_removed_after():
    before = (torch.Tensor.to, torch.nn.Module.__init__, torch.load, json.dumps)
    with Probes():
        assert torch.load is not before[2]
    assert (torch.Tensor.to, torch.nn.Module.__init__, torch.load, json.dumps) == before
    assert "to" not in torch.Tensor.__dict__ or torch.Tensor.__dict__["to"] is before[0]


def test_unstaged_time_splits_into_pre_and_postprocessing(clock):
    with trace(clock=WallClock(clock.now)) as t:
        with stage("validate"):
            clock.advance(1)
        clock.advance(2)  # preprocessing: between validation and the model
        with stage("infer"):
            clock.advance(5)
        clock.advance(3)  # postprocessing: after the model, before serialization
        with stage("serialize"):
            clock.advance(1)
        clock.advance(0.5)  # after serialization: framework
    d = split_other(t)
    assert d == pytest.approx({"validate": 1, "preprocess": 2, "infer": 5, "postprocess": 3, "serialize": 1, "other": 0.5})


def test_a_request_that_calls_no_model_is_sampled_between_validation_and_serialization(clock):
    # pure-Python scoring, or a library the probes do not know: the unstaged time has no pre or
    # post, and its window is what the sampler says it is spent on
    with trace(clock=WallClock(clock.now)) as t:
        with stage("validate"):
            clock.advance(1)
        clock.advance(6)  # the handler's own work
        with stage("serialize"):
            clock.advance(1)
        clock.advance(0.5)
    assert split_other(t) == pytest.approx({"validate": 1, "other": 6.5, "serialize": 1})
    [(lo, hi)] = stage_windows(t)["other"]
    assert ((lo - t.started_ns) / 1e6, (hi - t.started_ns) / 1e6) == pytest.approx((1, 7))


def test_the_probes_leave_torch_out_of_a_process_without_it_and_hook_it_when_the_handler_imports_it():
    """A scikit-learn endpoint measured in a process that torch was loaded into runs slower than
    its own (a forest's 40 calls: 10%); torch imported in the first request is still probed."""
    import subprocess
    import sys

    code = """
import sys
from servescope.doctor import DoctorOptions, diagnose

def predict(payload):
    import torch  # (the handler's own, late import)
    with torch.no_grad():
        return torch.nn.Linear(4, 2)(torch.ones(1, 4)).tolist()

from servescope.doctor.probes import Probes
with Probes():
    assert "torch" not in sys.modules, "the probes imported torch"
rep = diagnose(predict, payload={}, options=DoctorOptions(requests=4, concurrency=1, concurrent_requests=1, timeout_s=20.0))
print("forwards", rep.extra["evidence"]["warm"]["forwards"]["per_request"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] in (["forwards", "1"], ["forwards", "1.0"]), out.stdout
