"""Help-centre articles embedded for search, written well (inference mode, padding to the
longest text, a `def` route): eight articles of about 250 tokens a request. Its forward makes
buffers of tens of MB, which glibc's malloc hands back to the kernel after each request and maps
again on the next. Its twin is this file served with glibc's thresholds set (memory-churn)."""

import torch
from _common import minilm_path
from fastapi import FastAPI
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
app = FastAPI()


@app.post("/embed")
def embed(payload: dict):
    inputs = tokenizer(payload["docs"], padding=True, max_length=256, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1)
    vecs = torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)
    return {"embeddings": vecs.tolist()}
