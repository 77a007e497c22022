import torch
from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

PATH = minilm_path()
model = AutoModel.from_pretrained(PATH).eval()
tokenizer = AutoTokenizer.from_pretrained(PATH)
app = FastAPI()


class Req(BaseModel):
    text: str


@app.post("/embed")
def embed(req: Req):
    inputs = tokenizer([req.text], padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1)
    vec = (out * mask).sum(1) / mask.sum(1)
    return {"embedding": vec[0].tolist()}
