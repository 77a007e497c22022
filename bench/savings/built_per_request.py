"""An image classifier that builds its network and reads its weights on every request."""

import torch
from _common import ConvNet, ensure_weights, image_tensor
from fastapi import FastAPI

WEIGHTS = ensure_weights()
app = FastAPI()


@app.post("/predict")
def predict(payload: dict):
    x = image_tensor(payload["image"])
    model = ConvNet()
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu"))
    model.eval()
    with torch.inference_mode():
        probs = model(x).softmax(-1)[0]
    top = probs.topk(5)
    return {"classes": top.indices.tolist(), "scores": top.values.tolist()}
