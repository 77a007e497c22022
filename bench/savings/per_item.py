"""A title-embedding endpoint that tokenizes and runs each title of the request alone, in a loop."""

import torch
from _common import minilm_path
from fastapi import FastAPI
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
app = FastAPI()


@app.post("/embed")
def embed(payload: dict):
    vecs = []
    with torch.inference_mode():
        for text in payload["texts"]:
            inputs = tokenizer(text, truncation=True, return_tensors="pt")
            out = model(**inputs).last_hidden_state
            vecs.append(out.mean(1)[0])
    return {"embeddings": torch.stack(vecs).tolist()}
