"""The same streamer, its generator a plain `def`."""

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

torch.manual_seed(0)
VOCAB, HIDDEN = 8000, 768
embed = torch.nn.Embedding(VOCAB, HIDDEN)
cell = torch.nn.GRUCell(HIDDEN, HIDDEN)
head = torch.nn.Linear(HIDDEN, VOCAB)
app = FastAPI()


class Req(BaseModel):
    prompt: str
    max_tokens: int = 24


def step(token, h):
    h = cell(embed(token), h)
    return head(h).argmax(-1), h


@app.post("/generate")
async def generate(req: Req):
    def tokens():  # a plain generator: Starlette runs each step on its thread pool
        token = torch.tensor([sum(map(ord, req.prompt)) % VOCAB])
        h = torch.zeros(1, HIDDEN)
        for _ in range(req.max_tokens):
            with torch.inference_mode():
                token, h = step(token, h)
            yield f"data: {int(token)}\n\n"

    return StreamingResponse(tokens(), media_type="text/event-stream")
