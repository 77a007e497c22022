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
    with torch.inference_mode():
        y = torch.sigmoid(model(x))[:, 0]
    return {"scores": y.numpy().tolist()}
