"""A correct FastAPI endpoint on all-MiniLM-L6-v2: sync def (the thread pool), the model loaded
once at import, inference_mode, orjson; one request, one forward."""

import torch
from fastapi import FastAPI
from fastapi.responses import ORJSONResponse
from minilm import load, pool

tokenizer, model = load()
app = FastAPI()


@app.post("/predict")
def predict(payload: dict):
    batch = tokenizer([payload["text"]], truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        embedding = pool(model, batch)[0]
    return ORJSONResponse({"embedding": embedding.numpy()})
