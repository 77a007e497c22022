"""Cause: the forward runs with autograd on (Flask); on this small model it costs little."""

import torch
from flask import Flask, jsonify, request

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).eval()
app = Flask(__name__)


@app.post("/predict")
def predict():
    x = torch.tensor(request.get_json()["x"]).unsqueeze(0)
    y = model(x)
    return jsonify(scores=y[0].detach().tolist())
