"""An image classifier on ONNX Runtime in an async route that opens its session on every request."""

import onnxruntime as ort
from _onnx import ensure_model, pixels, top5
from fastapi import FastAPI

MODEL = ensure_model()
app = FastAPI()


@app.post("/predict")
async def predict(payload: dict):
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"pixels": pixels(payload["image"])})
    return top5(logits)
