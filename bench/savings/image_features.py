"""Image features for near-duplicate search, written well (weights loaded once, eval, inference
mode): a convolutional stem run at the image's full 224x224 resolution, its maps pooled to a
vector. Each map is 26 MB, which glibc's malloc hands back to the kernel after each request and
maps again on the next. Its twin is this file served with glibc's thresholds set (memory-churn)."""

import base64
import io

import numpy as np
import torch
from fastapi import FastAPI
from PIL import Image

torch.manual_seed(0)
stem = torch.nn.Sequential(
    torch.nn.Conv2d(3, 128, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(),
).eval()  # (random weights: the timing is the point, and no weights file is needed)
app = FastAPI()


@app.post("/features")
def features(payload: dict):
    img = Image.open(io.BytesIO(base64.b64decode(payload["image"]))).convert("RGB").resize((224, 224))
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1).unsqueeze(0)
    with torch.inference_mode():
        vec = torch.nn.functional.normalize(stem(x).mean((2, 3)), dim=-1)[0]
    return {"features": vec.tolist()}
