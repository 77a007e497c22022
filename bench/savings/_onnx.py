"""What the ONNX Runtime endpoints share, without torch: the savings' image network exported
to ONNX once per machine (in a process of its own, so the serving process never loads
torch), and the image's pixels as the session takes them."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

MODEL = os.path.join(tempfile.gettempdir(), "servescope-savings-convnet.onnx")
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def ensure_model() -> str:
    if not os.path.exists(MODEL):
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, "-c", "from _common import export_onnx; export_onnx()"], cwd=here, check=True)
    return MODEL


def pixels(b64: str, size: int = 96) -> np.ndarray:
    return pixels_of(base64.b64decode(b64), size)


def pixels_of(raw: bytes, size: int = 96) -> np.ndarray:
    img = Image.open(io.BytesIO(raw)).convert("RGB").resize((size, size))
    x = (np.asarray(img, dtype=np.float32) / 255 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))[None]


def top5(logits: np.ndarray) -> dict:
    p = np.exp(logits[0] - logits[0].max())
    p /= p.sum()
    top = np.argsort(p)[::-1][:5]
    return {"classes": top.tolist(), "scores": p[top].tolist()}
