"""A FastAPI service instrumented in one line; its handler marks two stages."""

import torch
from fastapi import FastAPI

import servescope
from servescope.exporters import PrometheusExporter
from servescope.middleware import ServescopeMiddleware

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).eval()
app = FastAPI()
app.add_middleware(ServescopeMiddleware, exporters=[PrometheusExporter()])


@app.post("/predict")
def predict(payload: dict):
    with servescope.stage("preprocess"):
        x = torch.tensor(payload["x"], dtype=torch.float32).unsqueeze(0)
    with servescope.stage("infer"), torch.inference_mode():
        y = model(x)
    return {"scores": y[0].tolist()}
