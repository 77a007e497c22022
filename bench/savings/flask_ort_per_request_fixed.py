import onnxruntime as ort
from _onnx import ensure_model, pixels_of, top5
from flask import Flask, jsonify, request

session = ort.InferenceSession(ensure_model(), providers=["CPUExecutionProvider"])
app = Flask(__name__)


@app.put("/classify")
def classify():
    (logits,) = session.run(None, {"pixels": pixels_of(request.files["image"].read())})
    return jsonify(top5(logits))
