"""Causes: an `async def` endpoint runs the model on the event loop, one request at a time
(so concurrent requests queue behind it, and none share a forward)."""

import torch
from fastapi import FastAPI

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)
).eval()
app = FastAPI()


@app.post("/predict")
async def predict(payload: dict):
    with torch.inference_mode():
        y = model(torch.tensor(payload["x"]).unsqueeze(0))
    return {"scores": y[0].numpy().tolist()}
