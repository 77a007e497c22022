"""FastAPI apps for the doctor's honesty tests."""

import asyncio
import math

import torch
from fastapi import FastAPI
from pydantic import BaseModel

search = FastAPI()


@search.post("/search")
def do_search(payload: dict):
    return {"n": len(payload)}


@search.get("/health")
def health():
    return {"ok": True}


class Query(BaseModel):
    text: str


strict = FastAPI()


@strict.post("/predict")
def predict_strict(q: Query):  # the doctor's payload has no "text": 422 for every request
    return {"n": len(q.text)}


never = FastAPI()


@never.post("/predict")
async def predict_never(payload: dict):
    await asyncio.sleep(3600)


torch.manual_seed(0)
_linear = torch.nn.Linear(64, 64).eval()
gil = FastAPI()


@gil.post("/predict")
def predict_gil(payload: dict):
    """A correct `def` endpoint (FastAPI's thread pool) whose postprocess is a pure-Python loop."""
    with torch.inference_mode():
        y = _linear(torch.ones(1, 64))
    vals = y[0].tolist()
    total = 0.0
    for i in range(150_000):
        total += math.sqrt(abs(vals[i % 64])) * 1.0001
    return {"score": total}
