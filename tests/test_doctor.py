"""The doctor in-process on small handlers: failures are data, bad input is one line."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from servescope.cli import main
from servescope.doctor import DoctorOptions, diagnose

FAST = DoctorOptions(requests=5, concurrency=2, concurrent_requests=4, timeout_s=2.0)


def test_a_handler_that_raises_is_reported_not_fatal():
    def predict(payload):
        raise KeyError("text")

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.errors == {"KeyError": 5}
    assert rep.extra["endpoint_errors"] == ["KeyError: 'text'"]
    assert rep.findings == []


def test_a_handler_that_hangs_times_out_and_the_doctor_goes_on():
    def predict(payload):
        time.sleep(5)

    opts = DoctorOptions(requests=3, concurrency=1, concurrent_requests=1, timeout_s=0.2)
    rep = diagnose(predict, payload={}, options=opts)
    assert any(e.startswith("timeout") for e in rep.extra["endpoint_errors"])
    assert rep.extra["verdict"]["diagnosed"] is False and rep.findings == []


def test_async_handlers_run_on_an_event_loop():
    async def predict(payload):
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.latency["count"] == 5 and not rep.errors


def exit_code(args):
    try:
        return main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "target, payload_text, message",
    [
        ("nope.py:predict", '{"x": 1}', "does not exist"),
        ("{file}:missing", '{"x": 1}', "has no 'missing'"),
        ("{file}:NUMBER", '{"x": 1}', "neither a callable handler, an ASGI/WSGI app nor a servescope.Model"),
        ("{file}:predict", "{not json", "is not valid JSON"),
        ("{file}", '{"x": 1}', "must look like path/to/file.py:name"),
        ("{broken}:predict", '{"x": 1}', "importing"),
    ],
)
def test_bad_targets_and_payloads_are_one_line_and_exit_2(tmp_path, capsys, target, payload_text, message):
    good = tmp_path / "handler.py"
    good.write_text("NUMBER = 3\n\ndef predict(payload):\n    return payload\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    payload = tmp_path / "payload.json"
    payload.write_text(payload_text)
    target = target.format(file=good, broken=broken)
    assert exit_code(["doctor", target, "--body", str(payload)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_payload_is_one_line(tmp_path, capsys):
    handler = tmp_path / "handler.py"
    handler.write_text("def predict(payload):\n    return payload\n")
    assert exit_code(["doctor", f"{handler}:predict"]) == 2
    err = capsys.readouterr().err
    assert "--body" in err and len(err.strip().splitlines()) == 1


# -- the verdict, the probes' manners ---------------------------------------------------------
import torch  # noqa: E402

from servescope.rules import diagnose_report  # noqa: E402


def test_when_every_request_fails_the_verdict_is_could_not_diagnose():
    def predict(payload):
        raise KeyError("text")

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["verdict"]["diagnosed"] is False
    assert rep.extra["verdict"]["failures"] == {"KeyError": 6}  # the cold request and five warm ones
    assert "5 of 5 warm requests failed" in rep.extra["verdict"]["reason"]


def test_a_handler_calling_sys_exit_is_a_failed_request():
    import sys

    def predict(payload):
        sys.exit(3)

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["verdict"]["failures"] == {"SystemExit": 6}


def test_partial_failures_are_a_finding_beside_the_others():
    calls = [0]

    def predict(payload):
        calls[0] += 1
        if calls[0] % 4 == 0:
            raise ValueError("every fourth request")
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=12, concurrency=2, concurrent_requests=8, timeout_s=2.0))
    assert rep.extra["verdict"]["diagnosed"] is True
    [f] = [f for f in rep.findings if f.id == "failing-requests"]
    assert f.severity == "high" and "every fourth request" in f.evidence["first_errors"]


def test_a_lazily_traced_and_frozen_torchscript_model_is_not_broken_by_the_probes():
    state = {}

    def predict(payload):
        x = torch.tensor(payload["x"], dtype=torch.float32).unsqueeze(0)
        if "model" not in state:
            m = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
            state["model"] = torch.jit.freeze(torch.jit.trace(m, x))
        with torch.inference_mode():
            return {"y": state["model"](x)[0].tolist()}

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit.trace; users still have it
        warnings.simplefilter("error", torch.jit.TracerWarning)  # the probes ran inside the tracer before
        rep = diagnose(predict, payload={"x": [1.0, 2.0, 3.0]}, options=FAST)
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors
    assert rep.extra.get("probes_disabled") is None


def test_a_probe_whose_own_code_raises_is_switched_off_and_the_call_goes_on():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x)

        def parameters(self, recurse=True):  # what the probe reads; raises here
            raise RuntimeError("parameters are sharded elsewhere")

    model = Odd().eval()

    def predict(payload):
        with torch.inference_mode():
            return {"y": model.lin(torch.ones(1, 4))[0].tolist(), "z": model(torch.ones(1, 4))[0].tolist()}

    rep = diagnose(predict, payload={}, options=FAST)
    assert not rep.errors and rep.extra["verdict"]["diagnosed"]
    assert "parameters are sharded elsewhere" in rep.extra["probes_disabled"]["torch module hooks"]
    assert "switched off mid-run" in rep.extra["not_checked"]["training-mode"]


def test_requests_that_fail_only_under_the_probes_are_measured_without_them():
    original_to = torch.Tensor.to

    def predict(payload):
        if torch.Tensor.to is not original_to:  # code that notices a wrapped method
            raise RuntimeError("Tensor.to was replaced")
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["verdict"]["diagnosed"] and rep.latency["count"] == 5
    ev = rep.extra["evidence"]
    assert "Tensor.to was replaced" in ev["probes_at_fault"]
    assert "the probes were switched off" in rep.extra["not_checked"]["grad-enabled"]


def test_training_mode_that_costs_nothing_is_listed_at_info():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())  # never .eval(); no dropout

    def predict(payload):
        with torch.inference_mode():
            return {"y": model(torch.ones(1, 8))[0].tolist()}

    for _ in range(2):  # the same answer every run: presence does not hang on a timing ratio
        rep = diagnose(predict, payload={}, options=FAST)
        [f] = [f for f in rep.findings if f.id == "training-mode"]
        assert f.evidence["changes_output"] is False and f.severity in ("info", "low")
    assert {f.id for f in diagnose_report(rep)} == {f.id for f in rep.findings}


def test_an_endpoint_that_fails_now_and_then_keeps_its_probed_evidence():
    calls = [0]

    def predict(payload):
        calls[0] += 1
        if calls[0] % 5 == 0:
            raise ValueError("flaky")
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=15, concurrency=2, concurrent_requests=8, timeout_s=2.0))
    assert rep.extra["evidence"]["probes_at_fault"] is None
    # an empty payload cannot be varied; a phase of a few milliseconds has no GIL samples
    assert "repeated-work" in rep.extra["not_checked"] and set(rep.extra["not_checked"]) <= {"repeated-work", "gil-contention"}
    assert "failing-requests" in {f.id for f in rep.findings}


def test_an_async_handler_raising_keyboardinterrupt_does_not_stop_the_loop():
    async def predict(payload):
        raise KeyboardInterrupt

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["verdict"]["failures"] == {"KeyboardInterrupt": 6}  # each request, not a timeout


def test_a_hang_only_under_concurrency_is_a_failure_not_dropped():
    import threading

    lock, in_flight = threading.Lock(), [0]

    def predict(payload):
        with lock:
            in_flight[0] += 1
            alone = in_flight[0] == 1
        try:
            if not alone:  # two at once: this one waits for ever (a deadlock)
                threading.Event().wait()
            time.sleep(0.02)
        finally:
            with lock:
                in_flight[0] -= 1
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=5, concurrency=2, concurrent_requests=6, timeout_s=0.5))
    [f] = [f for f in rep.findings if f.id == "failing-requests"]
    assert f.evidence["concurrent_failed"] >= 1 and f.evidence["warm_failed"] == 0
    assert "timeout" in rep.extra["verdict"]["failures"]
    # its load is not run again without the probes (the failures are the finding), and it says so
    assert rep.extra["evidence"]["concurrent"]["served_p50_ms"] is None
    assert "failed or unfinished" in rep.extra["evidence"]["missing"]["concurrent.served"]


def test_a_slow_endpoint_is_measured_not_cut_off_by_the_phase_budget():
    def predict(payload):
        time.sleep(0.3)
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=5, concurrency=2, concurrent_requests=4, timeout_s=5.0, max_seconds=0.5))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors and rep.latency["count"] >= 3


def test_each_call_gets_its_own_payload():
    def predict(payload):
        return {"n": len(payload.pop("text"))}  # changes its argument in place

    rep = diagnose(predict, payload={"text": "hello"}, options=FAST)
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors


def test_keyword_model_calls_are_seen_and_replayed_without_the_probes():
    from servescope.doctor.probes import Probes  # noqa: F401  (the hooks it installs are counted below)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 16)
            self.hooks_seen = []

        def forward(self, input_ids=None, attention_mask=None):
            self.hooks_seen.append((input_ids.shape[0], len(torch.nn.modules.module._global_forward_hooks)))
            return (self.emb(input_ids) * attention_mask.unsqueeze(-1)).sum(1)

    model = Encoder().eval()

    def predict(payload):
        inputs = {"input_ids": torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0]])}
        with torch.inference_mode():
            return {"v": model(**inputs)[0].tolist()}

    rep = diagnose(predict, payload={}, options=FAST)
    ev = rep.extra["evidence"]
    assert ev["warm"]["forwards"]["batch_sizes"] == [1] and ev["warm"]["forwards"]["pad_share"] == 0.625
    assert ev["batch_probe"]["per_item_ms"].keys() == {"1", "2", "4", "8", "16"}
    replayed = [hooks for batch, hooks in model.hooks_seen if batch == 16]
    assert replayed and set(replayed) == {0}  # the batch probe ran with the probes removed
    assert "padding-waste" in {f.id for f in rep.findings}


@pytest.mark.parametrize("helper", ["outside", "inside"])
@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_concurrent_requests_find_their_server_traces_by_id(kind, helper):
    """Each result of the concurrent phase is paired with the trace its answer names, not with
    the trace at its index: one that got no answer in time has none, and never takes another's.
    The load comes from a helper process (as a server's clients'), or from the doctor's own
    where no helper can run."""
    import threading

    from servescope.doctor.endpoints.http import ASGIEndpoint, WSGIEndpoint
    from servescope.doctor.endpoints.outside import OutsideLoad

    calls = iter(range(1_000))
    lock = threading.Lock()

    def slow_first() -> None:
        with lock:
            n = next(calls)
        if n == 0:  # the first request outlives its timeout; its trace arrives after the others'
            time.sleep(1.5)

    if kind == "asgi":

        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            slow_first()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"{}"})

        target = ASGIEndpoint(app, "/predict")
    else:

        def app(environ, start_response):
            slow_first()
            start_response("200 OK", [("Content-Length", "2")])
            return [b"{}"]

        target = WSGIEndpoint(app, "/predict")
    target.start(10)
    if helper == "inside":
        target._outside = OutsideLoad()
        target._outside.broken = "no helper could start"
    try:
        obs, _ = target.concurrent(b"{}", concurrency=2, requests=8, timeout_s=1.0, max_seconds=10)
        assert (target._outside.proc is not None) == (helper == "outside")
        assert target.load_from == "a helper process" if helper == "outside" else target.load_from.startswith("this process")
    finally:
        target.stop()
    ok = [o for o in obs if o.error is None]
    assert len(ok) >= 7 and all(o.trace is not None for o in ok)
    ids = [o.evidence["request_id"] for o in ok]
    assert len(set(ids)) == len(ids)  # each its own trace
    assert all(o.trace is None and not o.evidence for o in obs if o.error is not None)


def test_a_model_built_then_loaded_is_load_up_to_its_loader_not_preprocessing():
    from servescope.doctor.attribution import construction_window

    ms = 1_000_000
    # Net(): its modules made from 1 to 3 ms, its weights initialised until torch.load at 9 ms
    ev = {"first_init_ns": 1 * ms, "last_init_ns": 3 * ms, "load_windows": [(9 * ms, 12 * ms)]}
    assert construction_window(ev) == (1 * ms, 9 * ms)
    # built inside from_pretrained: the loader's own window covers it, nothing is added
    inside = {"first_init_ns": 10 * ms, "last_init_ns": 11 * ms, "load_windows": [(9 * ms, 12 * ms), (20 * ms, 21 * ms)]}
    assert construction_window(inside) == (10 * ms, 11 * ms)
    assert construction_window({}) is None


def test_the_batch_probe_interleaves_sizes_so_a_burst_of_contention_slows_each_of_them_alike():
    from servescope.doctor.batchprobe import batch_probe

    calls = [0]

    def replay(b):
        def call():
            calls[0] += 1
            # per call 2 ms + 0.15 ms a row; the last third of the probe's calls run beside a
            # neighbour's burst (+30 ms): timed size by size, batch 4 would see only the burst
            time.sleep(0.002 + 0.00015 * b + (0.03 if 21 <= calls[0] <= 30 else 0.0))

        return call

    probe = batch_probe(None, replay, None, (1, 2, 4))
    assert probe.best_batch == 4 and probe.gain is not None and probe.gain > 2.0, probe.per_item_ms


def test_the_batch_probes_rounds_stop_when_they_take_long_but_never_before_three():
    from servescope.doctor.batchprobe import MIN_ROUNDS, ROUNDS, _best_each

    for cost_s, rounds in ((0.001, ROUNDS), (0.5, MIN_ROUNDS)):  # a quiet model; a busy machine's batch of 16
        now, runs = [0.0], {"1": 0, "16": 0}

        def call(size, cost_s=cost_s, now=now, runs=runs):
            def run():
                runs[size] += 1
                now[0] += cost_s * int(size)  # (the clock moves only as the calls run)

            return run

        best = _best_each({k: call(k) for k in runs}, clock=lambda now=now: now[0])
        assert runs == {"1": rounds + 1, "16": rounds + 1}  # (+1: the first, unmeasured round)
        assert best == {"1": pytest.approx(cost_s * 1000), "16": pytest.approx(cost_s * 16000)}


def test_on_a_busy_machine_the_batch_probe_also_times_each_size_on_the_fewer_threads_left_free():
    import contextlib
    import threading

    from servescope.doctor.batchprobe import batch_probe

    class Torch:  # torch's thread counts as they behave: a thread's pool is fixed when it first computes
        def __init__(self) -> None:
            self.default, self.local = 2, threading.local()

        def set_num_threads(self, n: int) -> None:
            self.default = self.local.n = n

        def get_num_threads(self) -> int:
            if not hasattr(self.local, "n"):
                self.local.n = self.default
            return self.local.n

        inference_mode = enable_grad = staticmethod(contextlib.nullcontext)

    torch = Torch()

    def replay(b):
        def call():
            stalls = b > 1 and torch.get_num_threads() > 1  # a batched call split across two threads, one core taken
            time.sleep(0.015 if stalls else 0.0006 + 0.0002 * (b - 1))

        return call

    class Model:
        def modules(self):
            return []

    alone = batch_probe(torch, replay, Model(), (1, 2, 4))
    assert alone.best_batch == 1 and alone.fewer_threads is None  # at the default pool batching "never pays"
    busy = batch_probe(torch, replay, Model(), (1, 2, 4), fewer_threads=1)
    assert busy.fewer_threads == 1 and busy.best_batch == 4 and busy.gain > 1.5, busy
    assert busy.per_item_ms_fewer_threads["4"] < busy.per_item_ms_fewer_threads["1"]
    assert torch.default == 2  # the default pool size put back for the threads made later


def test_a_cpu_reading_says_how_long_until_the_kernels_counts_can_say_how_busy_the_machine_is():
    from servescope.environment import CpuReading

    now = [100.0]
    reading = CpuReading()
    reading._clock, reading.t0 = (lambda: now[0]), 100.0
    assert reading.readable_in() == CpuReading.MIN_S
    now[0] += 0.2
    assert abs(reading.readable_in() - (CpuReading.MIN_S - 0.2)) < 1e-9
    now[0] += 5.0
    assert reading.readable_in() == 0.0


def test_the_cpu_of_the_doctors_own_helper_process_is_counted_as_its_own_not_a_neighbours():
    import subprocess
    import sys

    from servescope.environment import HELPERS, helper_cpu_seconds

    burn = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"done\n"  # (it has used 0.3 s of CPU, however busy the machine)
        before = helper_cpu_seconds()
        HELPERS.add(child.pid)
        try:
            assert helper_cpu_seconds() - before >= 0.28  # (the kernel counts in ticks of 10 ms)
        finally:
            HELPERS.discard(child.pid)
        assert helper_cpu_seconds() == before
    finally:
        child.stdin.close()
        child.wait(10)
        child.stdout.close()


def test_the_concurrent_load_is_run_again_without_the_probes_for_the_p50_a_server_shows():
    from servescope.doctor.evidence import Evidence
    from servescope.rules import p50_at_loads
    from servescope.rules.savings import alone_and_together

    hooks = torch.nn.modules.module._global_forward_pre_hooks

    def predict(payload):  # 40 ms while the doctor's probes are installed, 10 ms without them
        time.sleep(0.04 if hooks else 0.01)
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=DoctorOptions(requests=5, concurrency=2, concurrent_requests=8, experiment_seconds=0))
    conc = rep.extra["evidence"]["concurrent"]
    assert conc["p50_ms"] >= 38 and 9 <= conc["served_p50_ms"] < 30 and conc["served_rps"] > conc["throughput_rps"]
    # ... and one at a time, before it: 10 ms, against the probed sequential requests' 40
    assert rep.latency["p50_ms"] >= 38 and 9 <= conc["served_alone_p50_ms"] < 30 and conc["served_alone_rps"] > conc["sequential_rps"]
    assert conc["served_alone_cores"] is not None and conc["served_alone_cores"] < 0.5  # (a sleep: no CPU)
    ev = Evidence.from_report(rep)
    assert alone_and_together(ev) == (conc["served_alone_p50_ms"], conc["served_p50_ms"], "without the probes")
    assert p50_at_loads(ev)["c=2"] == conc["served_p50_ms"]


def test_the_targets_import_counts_in_the_runs_aim_so_a_slow_import_leaves_the_late_fixes_less_time():
    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def forward(self, x):
            time.sleep(0.01)
            return self.lin(x)

    model = Slow().eval()

    def predict(payload):  # one call a request, never two together: the batching fix is called for at c=4
        with torch.no_grad():
            return model(torch.tensor([payload["x"]])).tolist()

    opts = DoctorOptions(requests=5, concurrency=4, concurrent_requests=16, timeout_s=2.0, max_seconds=4.0, experiment_seconds=6.0)
    ran = diagnose(predict, payload={"x": [0.5] * 8}, options=opts)
    assert ran.extra["evidence"]["experiments"]["batching"]["tried"], ran.extra["evidence"]["experiments"]["batching"]
    # an import that took the whole aim (4 + 6 + RUN_EXTRA_S) leaves the fixes at concurrency no time, said as such
    late = diagnose(predict, payload={"x": [0.5] * 8}, options=opts, import_s=40.0)
    ev = late.extra["evidence"]
    assert ev["seconds"] >= 40.0 and ev["seconds"] < 40.0 + ran.extra["evidence"]["seconds"] + 5
    what_if = ev["experiments"]["batching"]
    assert not what_if["tried"] and "importing the target took 40 s" in what_if["why_not"], what_if


def test_the_unprobed_requests_one_at_a_time_keep_to_their_budget_and_say_when_too_few_finished():
    from servescope.doctor.endpoints.function import FunctionEndpoint
    from servescope.doctor.served import unprobed_alone

    def predict(payload):
        time.sleep(0.2)
        return {"ok": True}

    ep = FunctionEndpoint(predict)
    ep.start(2.0)
    try:
        t0 = time.perf_counter()
        cut, why = unprobed_alone(ep, b"{}", timeout_s=2.0, budget_s=0.3)  # (two at most start within it)
        took = time.perf_counter() - t0
        full, none = unprobed_alone(ep, b"{}", timeout_s=2.0, budget_s=10.0)
    finally:
        ep.stop()
    assert cut == {} and "fewer than 3 requests" in why["concurrent.served_alone"] and took < 0.3 + 2 * 0.2 + 0.5
    assert none == {} and 0.19 < full["served_alone_p50_ms"] / 1000 < 0.6 and full["served_alone_cores"] < 0.5


def test_a_load_per_request_sends_a_fresh_process_whose_p50_is_said_beside_this_ones(tmp_path):
    """What a load per request costs depends on the process (its allocator's history): the doctor
    asks a fresh process of the endpoint for its p50 even when the first request was not slow,
    and says it where it differs; a first request that is not slow is still no cold start."""
    path = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(64, 64).state_dict(), path)
    model = torch.nn.Linear(64, 64).eval()
    asked = []

    def predict(payload):
        model.load_state_dict(torch.load(path))
        with torch.inference_mode():
            return {"y": model(torch.ones(1, 64)).sum().item()}

    def repeat_cold():
        asked.append(True)
        return 1.0, 40.0, None  # (first ms, the p50 after it, error): far slower than this process

    options = DoctorOptions(requests=6, concurrency=2, concurrent_requests=6, timeout_s=5.0, experiment_seconds=2.0)
    rep = diagnose(predict, payload={}, options=options, repeat_cold=repeat_cold)
    assert asked == [True]
    found = {f.id: f for f in rep.findings}
    assert "cold-start" not in found
    f = found["model-load-per-request"]
    assert f.evidence["fresh_process_p50_ms"] == 40.0 and "A fresh process of the endpoint as written ran at p50 40 ms" in f.detail


def test_the_start_ups_first_full_collection_runs_before_the_warm_requests_not_in_one():
    """The imports' and the model's objects are young when the first request has run: the
    collector's first full pass over them would land on a warm request (130 ms of an 8-ms Pillow
    endpoint's, every run). The doctor runs it between the first request and the warm ones."""
    import gc

    full, calls = [], []

    def watch(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(time.perf_counter())

    def predict(payload):
        calls.append(time.perf_counter())
        return {"ok": 1}

    gc.callbacks.append(watch)
    try:
        diagnose(predict, payload={}, options=DoctorOptions(requests=6, concurrency=2, concurrent_requests=6, timeout_s=5.0, experiment_seconds=0))
    finally:
        gc.callbacks.remove(watch)
    assert any(calls[0] < t < calls[1] for t in full), (calls[:2], full)


def test_the_fresh_process_of_a_model_loaded_per_request_is_kept_its_time_in_the_runs_aim():
    """The second first request runs after the experiments at concurrency: their time leaves
    room for its import and six requests, as for OpenMP's fresh processes."""
    from servescope.doctor.evidence import Evidence, Warm
    from servescope.doctor.restart import FRESH_IMPORT_S, Due

    run = SimpleNamespace(repeat_cold=lambda: None, probes_at_fault=None, import_s=3.0, try_environment=None, options=DoctorOptions())
    loads = Evidence(target_kind="function", warm=Warm(p50_ms=200.0, loads_per_request=1.0))
    assert Due(cold=True).expected_s(run, loads) == pytest.approx(3.0 + 6 * 0.2)
    assert Due(cold=True).expected_s(run, Evidence(target_kind="function", warm=Warm(p50_ms=200.0))) == 0.0
    run.import_s = 0.0  # (not timed: diagnose() called in-process)
    assert Due(cold=True).expected_s(run, loads) == pytest.approx(FRESH_IMPORT_S + 6 * 0.2)
    run.repeat_cold = None  # (no fresh process to start)
    assert Due(cold=True).expected_s(run, loads) == 0.0
