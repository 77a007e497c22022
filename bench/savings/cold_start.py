"""A text classifier whose model is loaded by the first request that needs it."""

import torch
from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()
_state = {}


class Req(BaseModel):
    text: str


def get_model():
    if "model" not in _state:
        from transformers import AutoModel, AutoTokenizer

        _state["tokenizer"] = AutoTokenizer.from_pretrained(minilm_path())
        _state["model"] = AutoModel.from_pretrained(minilm_path()).eval()
    return _state["tokenizer"], _state["model"]


@app.post("/classify")
def classify(req: Req):
    tokenizer, model = get_model()
    inputs = tokenizer(req.text, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        cls = model(**inputs).last_hidden_state[:, 0]
    return {"label": int(cls[0, :8].argmax()), "norm": float(cls.norm())}
