import onnxruntime as ort
from _onnx import ensure_model, pixels, top5
from fastapi import FastAPI

session = ort.InferenceSession(ensure_model(), providers=["CPUExecutionProvider"])
app = FastAPI()


@app.post("/predict")
async def predict(payload: dict):
    (logits,) = session.run(None, {"pixels": pixels(payload["image"])})
    return top5(logits)
