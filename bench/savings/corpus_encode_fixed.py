import numpy as np
from _common import minilm_path
from fastapi import FastAPI
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(minilm_path(), device="cpu")
DOCS = [f"note {i}: the shipment for order {i * 7} was {'late' if i % 3 else 'on time'} by {i % 5} days" for i in range(48)]
DOC_VECS = model.encode(DOCS, normalize_embeddings=True)
app = FastAPI()


@app.post("/search")
def search(payload: dict):
    q = model.encode([payload["query"]], normalize_embeddings=True)[0]
    scores = DOC_VECS @ q
    best = np.argsort(-scores)[:3]
    return {"hits": [{"doc": DOCS[i], "score": float(scores[i])} for i in best]}
