"""Cause: a TF-IDF search endpoint (FastAPI, scikit-learn) that vectorises its whole fixed
corpus again on every request, to score one query against it."""

import random

from fastapi import FastAPI
from pydantic import BaseModel
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import linear_kernel

rng = random.Random(0)
WORDS = "model serving latency request batch token queue thread cache memory python numpy vector search index query".split()
DOCUMENTS = [" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(400)]
vectorizer = TfidfVectorizer().fit(DOCUMENTS)
app = FastAPI()


class Query(BaseModel):
    text: str
    top_k: int = 5


@app.post("/search")
def search(q: Query):
    doc_vectors = vectorizer.transform(DOCUMENTS)  # the same 400 documents, every request
    scores = linear_kernel(vectorizer.transform([q.text]), doc_vectors)[0]
    best = scores.argsort()[::-1][: q.top_k]
    return {"ids": [int(i) for i in best], "scores": [float(scores[i]) for i in best]}
