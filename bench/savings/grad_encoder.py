"""A review-embedding endpoint (transformers) that runs its forward with autograd on."""

from _common import minilm_path
from fastapi import FastAPI
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
app = FastAPI()


@app.post("/embed")
def embed(payload: dict):
    inputs = tokenizer(payload["reviews"], padding=True, truncation=True, return_tensors="pt")
    out = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1)
    vecs = (out * mask).sum(1) / mask.sum(1)
    return {"embeddings": vecs.detach().numpy().tolist()}
