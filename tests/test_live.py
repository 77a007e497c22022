"""doctor --pid without a process: py-spy's trace events replayed, stacks put in stages, requests
told apart and the event loop's busy runs timed, on events written by hand (times known)."""

from __future__ import annotations

import os

import pytest

from servescope.doctor.evidence import Evidence, MissingEvidence
from servescope.doctor.live.active import Sequential
from servescope.doctor.live.flame import OUTSIDE, stacks_by_stage
from servescope.doctor.live.requests import analyse
from servescope.doctor.live.stages import in_request, package, stage_of
from servescope.doctor.live.trace import Frame, threads_of

SITE = "/venv/lib/python3.11/site-packages"
STD = "/usr/lib/python3.11"
APP = "/srv/app.py"

LOOP = [("Runner.run", f"{STD}/asyncio/runners.py", 118), ("BaseEventLoop.run_forever", f"{STD}/asyncio/base_events.py", 608)]
IDLE = LOOP + [("BaseEventLoop._run_once", f"{STD}/asyncio/base_events.py", 1884), ("EpollSelector.select", f"{STD}/selectors.py", 468)]
REQ = LOOP + [
    ("RequestResponseCycle.run_asgi", f"{SITE}/uvicorn/protocols/http/httptools_impl.py", 420),
    ("request_response.<locals>.app", f"{SITE}/starlette/routing.py", 75),
    ("run_endpoint_function", f"{SITE}/fastapi/routing.py", 381),
]
HANDLER = ("predict", APP, 20)
FORWARD = [("Module._wrapped_call_impl", f"{SITE}/torch/nn/modules/module.py", 1778), ("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 134)]
LOAD = [("load", f"{SITE}/torch/serialization.py", 1400)]
ENCODE = [("serialize_response", f"{SITE}/fastapi/routing.py", 200), ("jsonable_encoder", f"{SITE}/fastapi/encoders.py", 300)]


def frames(stack) -> tuple[Frame, ...]:
    return tuple(Frame(*f) for f in stack)


def events(timeline, tid=1, pid=7, name="MainThread"):
    """Chrome trace events as py-spy writes them: (time in ms, stack) each time the stack changes."""
    out, prev = [{"ph": "B", "name": f"thread ({tid}): {name}", "pid": pid, "tid": tid, "ts": 0, "args": {"filename": "", "line": 0}}], []
    for ms, stack in timeline:
        ts = int(ms * 1000)
        common = 0
        while common < min(len(prev), len(stack)) and prev[common] == stack[common]:
            common += 1
        for f in reversed(prev[common:]):
            out.append({"ph": "E", "name": f[0], "pid": pid, "tid": tid, "ts": ts, "args": {"filename": f[1], "line": f[2]}})
        for f in stack[common:]:
            out.append({"ph": "B", "name": f[0], "pid": pid, "tid": tid, "ts": ts, "args": {"filename": f[1], "line": f[2]}})
        prev = stack
    return out


def test_the_events_replay_as_spans_of_one_stack_each_with_the_threads_name():
    [th] = threads_of(events([(0, IDLE), (10, REQ + [HANDLER] + FORWARD), (40, IDLE), (50, [])]))
    assert th.name == "MainThread" and th.pid == 7
    assert [(s.t0_us, s.t1_us) for s in th.spans] == [(0, 10_000), (10_000, 40_000), (40_000, 50_000)]
    assert th.spans[1].frames[-1].name == "Linear.forward" and len(th.spans[1].frames) == len(REQ) + 1 + len(FORWARD)


@pytest.mark.parametrize(
    "stack, stage",
    [
        (REQ + [HANDLER] + FORWARD, "infer"),
        (REQ + [HANDLER] + LOAD, "load"),
        (REQ + [HANDLER, ("Module.load_state_dict", f"{SITE}/torch/nn/modules/module.py", 2600)], "load"),
        (REQ + [HANDLER, ("PreTrainedModel.from_pretrained", f"{SITE}/transformers/modeling_utils.py", 10)] + FORWARD, "load"),
        (REQ + [HANDLER, ("SentenceTransformer.encode", f"{SITE}/sentence_transformers/SentenceTransformer.py", 9)] + FORWARD, "infer"),
        (REQ + [HANDLER, ("PreTrainedTokenizerBase.__call__", f"{SITE}/transformers/tokenization_utils_base.py", 5)], "preprocess"),
        (REQ + ENCODE, "serialize"),
        (REQ + [("solve_dependencies", f"{SITE}/fastapi/dependencies/utils.py", 600)], "validate"),
        (REQ + [HANDLER, ("InferenceSession.run", f"{SITE}/onnxruntime/capi/onnxruntime_inference_collection.py", 260)], "infer"),
        (REQ + [HANDLER, ("ForestClassifier.predict_proba", f"{SITE}/sklearn/ensemble/_forest.py", 900)], "infer"),
        (REQ + [HANDLER, ("helper", APP, 30)], "other"),
    ],
)
def test_a_stack_in_a_request_is_in_the_stage_its_outermost_known_frame_names(stack, stage):
    assert in_request(frames(stack)) and stage_of(frames(stack)) == stage


def test_a_waiting_server_is_in_no_request_and_the_users_module_above_the_server_is_not_a_handler():
    assert not in_request(frames(IDLE))
    script = [("<module>", APP, 40), ("run", f"{SITE}/uvicorn/main.py", 500)] + IDLE[1:]
    assert not in_request(frames(script))
    pool_idle = [("Thread._bootstrap", f"{STD}/threading.py", 1002), ("WorkerThread.run", f"{SITE}/anyio/_backends/_asyncio.py", 900),
                 ("Queue.get", f"{STD}/queue.py", 171), ("Condition.wait", f"{STD}/threading.py", 327)]  # fmt: skip
    assert not in_request(frames(pool_idle))
    assert in_request(frames(pool_idle[:2] + [("run", f"{STD}/contextvars.py", 1), HANDLER] + FORWARD))


def test_calls_into_c_are_named_by_the_users_own_line(tmp_path):
    app = tmp_path / "svc.py"
    app.write_text("import pickle\ndef predict(p):\n    model = pickle.load(open('m.pkl', 'rb'))\n    x = batch.cuda()\n    return y.cpu().tolist()\n")
    at = lambda line: frames(REQ + [("predict", str(app), line)])  # noqa: E731
    assert [stage_of(at(n)) for n in (3, 4, 5)] == ["load", "to_device", "to_host"]


def test_packages_are_read_from_site_packages_before_the_standard_library():
    assert package(f"{SITE}/torch/serialization.py") == "torch"
    assert package(f"{STD}/json/encoder.py") == "json" and package(APP) == ""


def test_a_loads_name_is_the_one_the_load_once_fix_knows():
    from servescope.doctor.live.stages import load_label

    tok = ("AutoTokenizer.from_pretrained", f"{SITE}/transformers/models/auto/tokenization_auto.py", 900)
    assert load_label(frames(REQ + [HANDLER, tok])) == "AutoTokenizer.from_pretrained"
    assert load_label(frames(REQ + [HANDLER] + LOAD)) == "torch.load"
    built = ("Linear.__init__", f"{SITE}/torch/nn/modules/linear.py", 100)
    assert load_label(frames(REQ + [HANDLER, built])) == "nn.Module built"


def test_requests_are_told_apart_by_idle_gaps_and_the_users_code_split_around_the_model():
    body = [(0, IDLE)]
    for i in range(3):  # each request: 10 ms parse in the handler, 30 ms model, 10 ms to text; 50 ms idle
        t = 10 + i * 100
        body += [(t, REQ + [("predict", APP, 14)]), (t + 10, REQ + [HANDLER] + FORWARD), (t + 40, REQ + [("predict", APP, 22)]), (t + 50, IDLE)]
    body.append((310, []))
    s = analyse(threads_of(events(body)))
    assert s.requests == [{"preprocess": 10.0, "infer": 30.0, "postprocess": 10.0}] * 3
    assert s.calls == {"infer": 3} and s.stage_ms == {"other": 60.0, "infer": 90.0}
    # on the loop: 150 of 310 ms busy, the longest run 50 ms, three forwards there
    assert s.loop_busy_ms == 150.0 and s.loop_ms == 310.0 and s.loop_longest_ms == 50.0 and s.loop_infer_calls == 3
    assert s.hot_spots["infer"] == f"{APP}:20 predict" and s.hot_in_user_code["infer"]


def test_a_load_on_every_request_is_counted_once_each_with_its_call_named():
    body = []
    for i in range(4):
        t = i * 100
        body += [(t, REQ + [HANDLER] + LOAD), (t + 20, REQ + [("predict", APP, 16), ("Module.load_state_dict", f"{SITE}/torch/nn/modules/module.py", 2600)]),
                 (t + 30, REQ + [HANDLER] + FORWARD), (t + 60, IDLE)]  # fmt: skip
    body.append((400, []))
    s = analyse(threads_of(events(body)))
    assert s.calls["load"] == 4 and s.stage_ms["load"] == 120.0 and s.load_calls == ["torch.load"]
    assert len(s.requests) == 4


def test_work_on_a_worker_thread_leaves_the_loop_idle():
    worker = [("Thread._bootstrap", f"{STD}/threading.py", 1002), ("WorkerThread.run", f"{SITE}/anyio/_backends/_asyncio.py", 900), ("run", f"{STD}/contextvars.py", 1)]
    ev = events([(0, IDLE), (100, [])]) + events([(0, worker + [HANDLER] + FORWARD), (80, worker + [("Condition.wait", f"{STD}/threading.py", 327)]), (100, [])], tid=2, name="AnyIO worker thread")
    s = analyse(threads_of(ev))
    assert s.loop_busy_ms == 0.0 and s.loop_infer_calls == 0 and s.calls == {"infer": 1} and s.stage_ms == {"infer": 80.0}


def test_flames_group_every_stack_by_its_stage_in_microseconds():
    stacks = stacks_by_stage(threads_of(events([(0, IDLE), (10, REQ + [HANDLER] + FORWARD), (40, IDLE), (50, [])])))
    by_stage = {}
    for key, us in stacks.items():
        by_stage[key[0]] = by_stage.get(key[0], 0) + us
    assert by_stage == {OUTSIDE: 20_000, "infer": 30_000}


def test_the_clients_requests_line_up_with_the_sampled_ones_by_their_start():
    seq = Sequential(latencies=[20.0, 21.0, 22.0], windows=[(100.0, 100.02), (100.1, 100.121), (100.2, 100.222)])
    samples = analyse([])
    samples.requests, samples.bounds = [{"infer": 15.0}, {"infer": 16.0}], [(5_000, 20_000), (205_000, 221_000)]  # the second was missed
    assert seq.match(samples) == [({"infer": 15.0}, 20.0), ({"infer": 16.0}, 22.0)]


def test_what_stacks_cannot_show_is_not_checked_from_a_pid():
    ev = Evidence(target_kind="pid")
    ev.need_probes("torch.load", "from_pretrained")  # loads: on the stack while they run
    with pytest.raises(MissingEvidence, match="doctor --pid"):
        ev.need_probes("torch module hooks")


def test_a_load_on_requests_that_could_not_be_told_apart_is_sized_by_its_share_not_in_ms():
    from servescope.doctor.evidence import Warm
    from servescope.rules import loads

    ev = Evidence(target_kind="pid", warm=Warm(loads_per_request=1.0, load_ms_per_request=None, load_calls=["AutoTokenizer.from_pretrained"]))
    ev.stages = {"load": {"share": 0.55, "mean_ms": None, "p95_ms": None}}
    [f] = loads.model_load_per_request(ev)
    assert f.severity == "critical" and f.saving_ms is None and "55%" in f.detail and "--url" in f.detail
    assert "TOKENIZER = AutoTokenizer.from_pretrained(PATH)" in f.fix


def test_the_html_report_shows_each_stages_most_sampled_lines():
    from servescope.renderers.html import render_html
    from servescope.report import Report

    rep = Report(latency={}, stages={}, meta={"title": "servescope doctor --pid 1", "live": {"top_lines": {"load": [("/srv/app.py:15 predict", 812.5)]}}})
    page = render_html(rep)
    assert "Where the samples were, by stage" in page and "/srv/app.py:15 predict" in page and "812" in page


def _gil_evidence(held=0.97, inside=2.4, cores=1.02):
    from servescope.doctor.evidence import Concurrent, Machine

    conc = Concurrent(concurrency=4, requests=24, throughput_rps=20.0, sequential_rps=21.0, gil_busy_share=held,
                      threads_in_requests=inside, cpu_cores_busy=cores, worker_hot_spot="/srv/app.py:57 predict")  # fmt: skip
    return Evidence(target_kind="pid", concurrent=conc, machine=Machine(cpus_available=2.0))


def test_requests_that_take_turns_on_the_gil_are_named_from_outside():
    from servescope.rules.concurrency import gil_contention

    [f] = gil_contention(_gil_evidence())
    assert f.id == "gil-contention" and f.evidence["gil_held_share"] == 0.97 and "97%" in f.detail
    # server time per request now (50 ms) against two at once at the sequential rate (23.8 ms)
    assert f.saving_ms == pytest.approx(1000 / 20 - 1000 / 42, abs=0.01) and f.saving_basis == "estimated"
    assert gil_contention(_gil_evidence(cores=1.8)) == []  # native code ran in parallel
    assert gil_contention(_gil_evidence(held=0.5)) == []  # the GIL was often free
    assert gil_contention(_gil_evidence(inside=1.1)) == []  # one request at a time


def test_the_gils_holders_give_each_process_its_share_of_the_phase():
    from servescope.doctor.live.cpu import gil_busy_share

    held = threads_of(events([(0, REQ + [HANDLER]), (600, [])]) + events([(0, REQ + [HANDLER]), (200, [])], tid=3, pid=8))
    assert gil_busy_share(held, 1.0) == {7: 0.6, 8: 0.2}


def test_the_cpu_a_process_used_is_read_from_its_threads():
    import os
    import time

    from servescope.doctor.live.cpu import ProcessCpu

    t0 = time.perf_counter()
    cpu = ProcessCpu([os.getpid()])
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    busy, waiting, threads = cpu.since()
    wall = time.perf_counter() - t0  # (a busy machine stretches the wall, not the CPU time)
    assert busy is not None and busy * wall >= 0.28 and waiting is not None and waiting >= 0.0 and threads >= 1


def test_more_busy_threads_than_cpus_that_wait_for_one_are_named_from_outside():
    from servescope.doctor.evidence import Concurrent, Machine
    from servescope.rules.threads import thread_oversubscription

    def ev(busy, waiting, cores=1.9):
        conc = Concurrent(concurrency=4, threads_busy=busy, cpu_wait_cores=waiting, processes=2, cpu_cores_busy=cores)
        return Evidence(target_kind="pid", concurrent=conc, machine=Machine(cpus_available=2.0, others_cores=0.0))

    [f] = thread_oversubscription(ev(6, 1.4))
    assert f.severity == "high" and f.saving_ms is None and "torch.set_num_threads(1)" in f.fix and "cannot be seen from outside" in f.detail
    assert thread_oversubscription(ev(6, 0.1)) == [] and thread_oversubscription(ev(2, 1.4)) == []
    assert thread_oversubscription(ev(6, 1.4, cores=1.0)) == []  # threads taking turns on the GIL leave the CPUs free


def test_servescope_serves_own_runtime_is_the_server_and_its_model_call_is_in_a_request():
    from pathlib import Path

    import servescope

    ours = Path(servescope.__file__).parent
    worker = [("Thread.run", f"{STD}/threading.py", 982), ("Batcher.run", str(ours / "serve/batching.py"), 170),
              ("Runtime.process", str(ours / "serve/runtime.py"), 158), ("Model.infer", str(ours / "serve/model.py"), 95)]  # fmt: skip
    assert in_request(frames(worker + FORWARD)) and stage_of(frames(worker + FORWARD)) == "infer"
    pusher = [("Thread.run", f"{STD}/threading.py", 982), ("ServescopeReplica._pusher", str(ours / "serve/ray_serve.py"), 172)]
    assert not in_request(frames(pusher))  # the runtime's own housekeeping is nobody's request


def test_a_loop_in_python_code_without_the_gil_is_waiting_for_it_not_working():
    # the loop thread sits in FastAPI's serializer for 100 ms while worker threads hold the GIL
    stack = REQ + ENCODE
    loop = events([(0, stack), (100, [])])
    waiting = analyse(threads_of(loop), gil=threads_of(events([(0, stack), (20, [])])))  # it held the GIL 20 ms of 100
    working = analyse(threads_of(loop), gil=threads_of(events([(0, stack), (100, [])])))
    assert waiting.loop_busy_ms == 0.0 and waiting.loop_longest_ms == 0.0
    assert working.loop_busy_ms == 100.0 and working.loop_longest_ms == 100.0
    # a forward releases the GIL and still works: native stages count whoever holds it
    native = analyse(threads_of(events([(0, REQ + [HANDLER] + FORWARD), (100, [])])), gil=[])
    assert native.loop_busy_ms == 100.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["doctor", "app.py:app", "--pid", "12"], "without a TARGET"),
        (["doctor", "--url", "http://127.0.0.1:9/p", "--flames", "d"], "go with --pid"),
        (["doctor", "--pid", "12", "--url", "http://127.0.0.1:9/p", "--duration", "5s"], "does not go with --url"),
    ],
)
def test_options_that_do_not_go_together_are_one_line_and_exit_2(args, message, capsys):
    from servescope.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_torn_stack_dump_of_a_busy_process_is_read_again_not_called_a_refusal(tmp_path, monkeypatch):
    from servescope.doctor.live import spy

    tries = tmp_path / "tries"
    fake = tmp_path / "py-spy"  # fails twice the way py-spy does when the stacks changed mid-read
    fake.write_text(
        "#!/bin/sh\n"
        f'n=$(cat {tries} 2>/dev/null || echo 0); echo $((n+1)) > {tries}\n'
        'if [ "$n" -lt 2 ]; then echo "Error: Failed to get stack traces" >&2; exit 1; fi\n'
        "echo '[{\"thread_id\": 1}, {\"thread_id\": 2}]'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(spy, "py_spy", lambda: str(fake))
    assert spy.check_target(os.getppid()) == 2
    assert tries.read_text().strip() == "3"
    tries.write_text("-5")  # always torn: said after the last try
    with pytest.raises(spy.AttachError, match="Failed to get stack traces"):
        spy.check_target(os.getppid())
