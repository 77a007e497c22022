"""Healthy: one ONNX Runtime session, created at start-up; a request's rows in one run."""

import numpy as np
import onnxruntime as ort

from onnx_mlp import mlp_bytes

session = ort.InferenceSession(mlp_bytes(), providers=["CPUExecutionProvider"])


def predict(payload):
    x = np.asarray(payload["rows"], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    return {"labels": y.argmax(axis=1).tolist()}
