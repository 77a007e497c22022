"""Cause: an ONNX Runtime session created once, but each request runs its one row alone:
concurrent requests never share a batch, though a batch of 16 costs far less per row."""

import numpy as np
import onnxruntime as ort

from onnx_mlp import mlp_bytes

opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
session = ort.InferenceSession(mlp_bytes(), opts, providers=["CPUExecutionProvider"])


def predict(payload):
    x = np.asarray([payload["x"]], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    return {"scores": y[0].tolist()}
