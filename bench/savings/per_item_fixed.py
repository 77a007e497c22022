import torch
from _common import minilm_path
from fastapi import FastAPI
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
app = FastAPI()


@app.post("/embed")
def embed(payload: dict):
    inputs = tokenizer(payload["texts"], padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1)
    vecs = (out * mask).sum(1) / mask.sum(1)  # each title's own tokens, as it was alone
    return {"embeddings": vecs.tolist()}
