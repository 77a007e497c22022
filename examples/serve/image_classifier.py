"""An image classifier on servescope.serve: images arrive base64-encoded in JSON, are decoded
and resized with Pillow in ``preprocess`` (per item, on the worker), and batched for one
forward; ``top_k`` is per request.

    servescope serve examples/serve/image_classifier.py:Classifier --port 8000
    python -c "import base64,json;print(json.dumps({'image': base64.b64encode(open('cat.jpg','rb').read()).decode(), 'top_k': 3}))" > req.json
    curl -s localhost:8000/predict -d @req.json

The network is a small CNN with fixed random weights (no model hub here): put yours in ``load``.
"""

import base64
import binascii
import io

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

import servescope

LABELS = ["cat", "dog", "bird", "car", "tree", "boat", "house", "person"]
SIZE = 64
MEAN, STD = np.array([0.485, 0.456, 0.406], dtype=np.float32), np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _png(color, size=(80, 60)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


class Classifier(servescope.Model):
    example = {"image": _png((200, 30, 30)), "top_k": 3}

    def load(self, device):
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, len(LABELS)),
        )  # fmt: skip

    def validate(self, payload):
        top_k = payload.get("top_k", 1)
        if not isinstance(top_k, int) or not 1 <= top_k <= len(LABELS):
            raise servescope.InvalidPayload(f"top_k must be a whole number from 1 to {len(LABELS)}", field="top_k")
        try:
            data = base64.b64decode(payload["image"], validate=True)
            image = Image.open(io.BytesIO(data))
            image.verify()  # a truncated or non-image file is the client's error: 422
        except (KeyError, TypeError, binascii.Error, UnidentifiedImageError, OSError) as exc:
            raise servescope.InvalidPayload("image must be a base64-encoded PNG or JPEG", field="image") from exc
        return {"image": data, "top_k": top_k}

    def preprocess(self, request):
        image = Image.open(io.BytesIO(request["image"])).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
        pixels = (np.asarray(image, dtype=np.float32) / 255 - MEAN) / STD
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy())  # [3, H, W]: the runtime stacks them

    def postprocess(self, logits, request):
        probs = torch.softmax(logits, dim=-1)
        top = torch.topk(probs, request["top_k"])
        return {"labels": [{"label": LABELS[i], "p": round(float(p), 4)} for p, i in zip(top.values, top.indices)]}
