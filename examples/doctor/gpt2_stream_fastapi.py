"""Causes: a token streamer (FastAPI StreamingResponse, a GPT-2-shaped transformers model) whose
generator decodes each stream alone, one batch-of-one forward per token, and wraps its loop,
yield included, in ``torch.inference_mode()``: Starlette resumes a sync generator on whichever
worker thread is free, and inference mode is per thread, so streams fail once several run at
once. (The weights are random: the model is built from its config, no download.)"""

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2, n_head=4)).eval()
app = FastAPI()


class Prompt(BaseModel):
    ids: list[int]
    max_tokens: int = 16


@app.post("/generate")
def generate(req: Prompt):
    def tokens():
        ids, cache = torch.tensor([req.ids]), None
        with torch.inference_mode():
            for _ in range(req.max_tokens):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
                yield f"{int(ids)}\n"

    return StreamingResponse(tokens(), media_type="text/plain")
