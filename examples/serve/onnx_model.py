"""An ONNX Runtime model on servescope.serve (no torch): a vector in, scores out; concurrent
requests' rows run as one ``session.run``.

    servescope serve examples/serve/onnx_model.py:Scorer --port 8000
    curl -s localhost:8000/predict -d '{"x": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}'

Your model is a file (``onnxruntime.InferenceSession("model.onnx", ...)`` in ``load``); this
one is a two-layer MLP built with onnx's helpers, with fixed weights, so the example runs anywhere.
"""

import numpy as np

import servescope

IN, HIDDEN, OUT = 8, 32, 3


def _mlp_bytes() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(IN, HIDDEN)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(HIDDEN, OUT)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


class Scorer(servescope.Model):
    example = {"x": [0.0] * IN}

    def load(self, device):
        import onnxruntime

        return onnxruntime.InferenceSession(_mlp_bytes(), providers=["CPUExecutionProvider"])

    def validate(self, payload):
        if not isinstance(payload, dict) or len(payload.get("x") or []) != IN:
            raise servescope.InvalidPayload(f"x needs {IN} numbers", field="x")
        return payload

    def preprocess(self, request):
        return np.asarray(request["x"], dtype=np.float32)

    def collate(self, inputs):
        return np.stack(inputs)  # a numpy batch for ONNX Runtime (the default makes torch tensors when torch is there)

    def infer(self, batch):
        (y,) = self.model.run(None, {"x": batch})
        return y

    def postprocess(self, output):
        return {"scores": output.tolist(), "label": int(output.argmax())}
