"""A Flask service instrumented in one line; its views mark their stages (one streams)."""

import torch
from flask import Flask, jsonify, request

import servescope
from servescope.exporters import PrometheusExporter
from servescope.middleware import ServescopeWSGIMiddleware

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).eval()
app = Flask(__name__)
app.wsgi_app = ServescopeWSGIMiddleware(app.wsgi_app, exporters=[PrometheusExporter()])


@app.post("/predict")
def predict():
    with servescope.stage("preprocess"):
        x = torch.tensor(request.get_json()["x"], dtype=torch.float32).unsqueeze(0)
    with servescope.stage("infer"), torch.inference_mode():
        y = model(x)
    return jsonify(scores=y[0].tolist())


@servescope.stage("postprocess")  # each chunk's making is timed, not the sending
def scores_by_row(rows: int):
    with torch.inference_mode():
        for _ in range(rows):
            yield f"{model(torch.randn(1, 256))[0].argmax().item()}\n"


@app.get("/stream")
def stream():
    return app.response_class(scores_by_row(int(request.args.get("rows", 4))), mimetype="text/plain")
