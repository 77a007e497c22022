"""A FastAPI service instrumented in one line; its handlers mark their stages (one streams)."""

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

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


@servescope.stage("postprocess")  # each chunk's making is timed, not the sending
async def scores_by_row(rows: int):
    with torch.inference_mode():
        for _ in range(rows):
            yield f"{model(torch.randn(1, 256))[0].argmax().item()}\n"


@app.get("/stream")
async def stream(rows: int = 4):
    return StreamingResponse(scores_by_row(rows), media_type="text/plain")
