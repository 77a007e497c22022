"""A sentence-embedding endpoint: each request encodes its one sentence alone."""

from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(minilm_path(), device="cpu")
app = FastAPI()


class Req(BaseModel):
    text: str


@app.post("/embed")
def embed(req: Req):
    return {"embedding": model.encode(req.text).tolist()}
