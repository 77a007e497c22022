"""A tabular network scoring a batch of rows per request, with autograd left on."""

import torch
from fastapi import FastAPI

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
    torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 1),
).eval()
app = FastAPI()


@app.post("/score")
def score(payload: dict):
    x = torch.tensor(payload["rows"], dtype=torch.float32)
    y = torch.sigmoid(model(x))[:, 0]
    return {"scores": y.detach().numpy().tolist()}
