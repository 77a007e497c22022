"""Cause: the model was never put in eval mode, so dropout is active (FastAPI, def endpoint)."""

import torch
from fastapi import FastAPI
from pydantic import BaseModel

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 2))
app = FastAPI()


class Payload(BaseModel):
    x: list[float]


@app.post("/predict")
def predict(payload: Payload):
    with torch.inference_mode():
        y = model(torch.tensor(payload.x).unsqueeze(0))
    return {"scores": y[0].tolist()}
