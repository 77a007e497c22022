"""Cause: a token streamer (FastAPI StreamingResponse, a GPT-2-shaped transformers model) whose
decoding loop runs in an ``async def`` generator: every step's forward runs on the event loop,
so one stream's steps hold up every other request. (Random weights: built from its config.)"""

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
async def generate(req: Prompt):
    async def tokens():
        ids, cache = torch.tensor([req.ids]), None
        for _ in range(req.max_tokens):
            with torch.inference_mode():
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
            yield f"{int(ids)}\n"

    return StreamingResponse(tokens(), media_type="text/plain")
