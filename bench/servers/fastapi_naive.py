"""What many endpoints look like: FastAPI, the model called inside `async def`."""

import torch
from fastapi import FastAPI
from mlp import build

app = FastAPI()
model = build()


@app.post("/predict")
async def predict(payload: dict):
    x = torch.tensor(payload["x"], dtype=torch.float32).unsqueeze(0)
    with torch.inference_mode():
        y = model(x)
    return {"logits": y[0].tolist()}
