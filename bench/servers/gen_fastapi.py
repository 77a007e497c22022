"""A correct FastAPI streaming endpoint on the same decoder as examples/serve/generate.py: the
model loaded once at import, a sync generator (Starlette runs each step on its thread pool),
every step under inference_mode, the KV cache, Server-Sent Events; one request, one sequence."""

import sys
from pathlib import Path

import orjson
import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "serve"))
from generate import Generate  # noqa: E402  (its load(): the same weights, the same tokenizer)

g = Generate()
model = g.load("cpu").eval()
tokenizer = g.tokenizer
app = FastAPI()


@app.post("/predict")
def predict(payload: dict):
    ids = tokenizer(payload["prompt"], add_special_tokens=False)["input_ids"][-256:] or [tokenizer.unk_token_id]
    n = int(payload.get("max_tokens", 16))

    def tokens():
        x = torch.tensor([ids])
        cache = None
        for _ in range(n):
            with torch.inference_mode():
                out = model(input_ids=x, cache=cache, use_cache=True)
                cache = out.cache
                token = out.logits[:, -1].argmax(-1)
            yield b"data: " + orjson.dumps({"token": tokenizer.decode([int(token)])}) + b"\n\n"
            x = token[:, None]

    return StreamingResponse(tokens(), media_type="text/event-stream")
