"""A sentence-embedding endpoint written as `async def`: the forward runs on the event loop."""

import torch
from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
app = FastAPI()


class Req(BaseModel):
    text: str


@app.post("/embed")
async def embed(req: Req):
    inputs = tokenizer([req.text], return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs).last_hidden_state
    return {"embedding": out.mean(1)[0].tolist()}
