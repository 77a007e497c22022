"""What the doctor's probes add to a request, against the same handler without them.

    python bench/probe_overhead.py

Calls handlers in a trace (a small MLP endpoint; one that returns a 200x384 output through
json.dumps; a keyword-called encoder with an attention mask, as transformers models are
called; an ONNX Runtime session; a scikit-learn predict) with and without the probes
installed, interleaved, median of repeats; prints us per request and the difference.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from servescope import trace
from servescope.doctor.probes import Probes, new_evidence, set_evidence

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).eval()
BIG = torch.nn.Linear(384, 384).eval()
X = [0.1] * 256


def mlp_handler() -> str:
    x = torch.tensor(X).unsqueeze(0)
    with torch.inference_mode():
        y = MLP(x)
    return json.dumps({"y": y[0].tolist()})


def big_handler() -> str:
    with torch.inference_mode():
        y = BIG(torch.ones(200, 384))
    return json.dumps({"v": y.tolist()})


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 64)
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, input_ids=None, attention_mask=None):
        return self.lin(self.emb(input_ids) * attention_mask.unsqueeze(-1)).sum(1)


ENC = Encoder().eval()
IDS = {"input_ids": torch.arange(32).unsqueeze(0), "attention_mask": torch.ones(1, 32, dtype=torch.long)}


def kwargs_handler() -> str:
    with torch.inference_mode():
        y = ENC(**IDS)
    return json.dumps({"y": y[0].tolist()})


def _ort_session():
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((256, 10), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _sklearn_model():
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    return LogisticRegression().fit(rng.standard_normal((100, 256)), rng.integers(0, 2, 100))


def per_request(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        set_evidence(new_evidence())
        with trace():
            fn()
    return (time.perf_counter_ns() - t0) / n / 1000


def main() -> None:
    import numpy as np

    session, clf = _ort_session(), _sklearn_model()
    row = np.asarray([X], dtype=np.float32)

    def ort_handler() -> str:
        (y,) = session.run(None, {"x": row})
        return json.dumps({"y": y[0].tolist()})

    def sklearn_handler() -> str:
        return json.dumps({"p": clf.predict_proba(row)[0].tolist()})

    rows = {}
    cases = (
        ("MLP 256-512-10, JSON out", mlp_handler, 500),
        ("200x384 output through json.dumps", big_handler, 40),
        ("model(**inputs), attention mask", kwargs_handler, 500),
        ("ONNX Runtime session.run", ort_handler, 500),
        ("scikit-learn predict_proba", sklearn_handler, 500),
    )
    for name, fn, n in cases:
        plain, probed = [], []
        for _ in range(7):
            plain.append(per_request(fn, n))
            with Probes():
                probed.append(per_request(fn, n))
        rows[name] = (statistics.median(plain), statistics.median(probed))
    print("probe overhead per request (median of 7 interleaved repeats)")
    for name, (a, b) in rows.items():
        print(f"  {name:<36} without {a:9.1f} us   with probes {b:9.1f} us   +{b - a:7.1f} us ({(b / a - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
