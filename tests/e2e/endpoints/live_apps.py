"""Servers the doctor attaches to (doctor --pid): each with one cause a stack shows."""

import io
import random

import torch
from fastapi import FastAPI
from flask import Flask, jsonify, request

torch.manual_seed(0)
NET = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
_buf = io.BytesIO()
torch.save(NET.state_dict(), _buf)
WEIGHTS = _buf.getvalue()

# an `async def` route that runs the model on the event loop
on_loop = FastAPI()


@on_loop.post("/predict")
async def predict_on_loop(payload: dict):
    x = torch.tensor(payload["x"], dtype=torch.float32).reshape(-1, 256)
    with torch.no_grad():
        for _ in range(30):
            y = NET(x)
    return {"y": y[0, :4].tolist()}


# a Flask view that loads the weights on every request (served by gunicorn workers)
loads = Flask("loads")


@loads.post("/predict")
def predict_loading():
    state = torch.load(io.BytesIO(WEIGHTS))
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    net.load_state_dict(state)
    x = torch.tensor(request.get_json()["x"], dtype=torch.float32).reshape(-1, 256)
    with torch.no_grad():
        y = net.eval()(x)
    return jsonify({"y": y[0, :4].tolist()})


# a Flask view whose answer takes longer to turn into JSON than to compute
slow_json = Flask("slow_json")
ROWS = [{"id": i, "score": random.random(), "label": f"item-{i}", "tags": ["a", "b", "c"]} for i in range(20_000)]


@slow_json.post("/predict")
def predict_rows():
    k = int(request.get_json().get("k", 20_000))
    return jsonify({"rows": ROWS[:k]})
