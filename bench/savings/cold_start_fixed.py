import torch
from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(minilm_path())
model = AutoModel.from_pretrained(minilm_path()).eval()
with torch.inference_mode():  # warm-up, before the server takes traffic
    model(**tokenizer("warm up the model", return_tensors="pt"))
app = FastAPI()


class Req(BaseModel):
    text: str


@app.post("/classify")
def classify(req: Req):
    inputs = tokenizer(req.text, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        cls = model(**inputs).last_hidden_state[:, 0]
    return {"label": int(cls[0, :8].argmax()), "norm": float(cls.norm())}
