"""An image classifier behind Flask (a PUT upload read as bytes, served by gunicorn), on ONNX
Runtime, that opens its session on every request."""

import onnxruntime as ort
from _onnx import ensure_model, pixels_of, top5
from flask import Flask, jsonify, request

MODEL = ensure_model()
app = Flask(__name__)


@app.put("/classify")
def classify():
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"pixels": pixels_of(request.files["image"].read())})
    return jsonify(top5(logits))
