"""Healthy: an ONNX Runtime session created once (Flask); a request's rows in one run."""

import numpy as np
import onnxruntime as ort
from flask import Flask, jsonify, request

from onnx_mlp import mlp_bytes

session = ort.InferenceSession(mlp_bytes(seed=1), providers=["CPUExecutionProvider"])
app = Flask(__name__)


@app.post("/predict")
def predict():
    x = np.asarray(request.get_json()["rows"], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    return jsonify({"labels": y.argmax(axis=1).tolist()})
