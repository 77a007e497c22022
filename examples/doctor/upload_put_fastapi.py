"""Cause: an image classifier behind a PUT route that takes a multipart upload (FastAPI,
Pillow), which reads its weights (18 MB, most in its head) from disk again on every request."""

import io
import os
import tempfile

import numpy as np
import torch
from fastapi import FastAPI, File, UploadFile
from PIL import Image

WEIGHTS = os.path.join(tempfile.gettempdir(), "servescope-gallery-upload.pt")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, 2, 1), torch.nn.ReLU(),
    torch.nn.Conv2d(64, 128, 3, 2, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    torch.nn.Linear(128, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 4),
).eval()
torch.save(model.state_dict(), WEIGHTS)
app = FastAPI()


@app.put("/v1/classify")
def classify(image: UploadFile = File(...)):
    model.load_state_dict(torch.load(WEIGHTS))  # the weights read again, on every request
    img = Image.open(io.BytesIO(image.file.read())).convert("RGB").resize((64, 64))
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).unsqueeze(0)
    with torch.inference_mode():
        y = model(x)[0]
    return {"label": int(y.argmax()), "scores": y.tolist()}
