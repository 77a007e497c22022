"""Causes: an ONNX Runtime endpoint that creates its session on every request, and runs
each request's row alone (concurrent requests never share a batch)."""

import numpy as np
import onnxruntime as ort

from onnx_mlp import mlp_bytes

MODEL = mlp_bytes()


def predict(payload):
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])  # per request
    x = np.asarray([payload["x"]], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    return {"scores": y[0].tolist()}
