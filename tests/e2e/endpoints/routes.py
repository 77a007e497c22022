"""An app whose routes are not POST /predict: a PUT, a GET with a query string, an upload."""

import numpy as np
from fastapi import FastAPI, File, UploadFile

app = FastAPI()
W = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)


@app.put("/v1/embed")
def embed(body: dict) -> dict:
    x = np.frombuffer(body["text"].encode().ljust(64)[:64], dtype=np.uint8).astype(np.float32)
    return {"embedding": (x @ W).tolist()}


@app.get("/search")
def search(q: str, k: int = 3) -> dict:
    return {"hits": [q] * k}


@app.post("/classify")
async def classify(image: UploadFile = File(...)) -> dict:
    raw = await image.read()
    return {"bytes": len(raw), "mean": float(np.frombuffer(raw, dtype=np.uint8).mean())}
