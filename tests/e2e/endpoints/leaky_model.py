"""A servescope.Model whose failures carry secrets in their text (tests/e2e/test_serve_e2e.py)."""

import torch

import servescope


class Leaky(servescope.Model):
    example = {"x": [0.0, 0.0, 0.0, 0.0]}

    def load(self, device):
        return torch.nn.Linear(4, 2)

    def validate(self, payload):
        if "db" in payload:
            raise ConnectionError("postgres://admin:hunter2@db.internal/prod refused")
        return payload["x"]

    def preprocess(self, item):
        if item[0] < 0:
            raise RuntimeError("secret token=sk-LIVE-123456 in /home/alice/models/ckpt.pt")
        return torch.tensor(item, dtype=torch.float32)

    def postprocess(self, output):
        return {"y": output.numpy()}
