"""The MLP from the benchmarks (256-2048-2048-10), served with servescope.serve.

    servescope serve examples/mlp_serve.py:MLP --port 8000
    curl -s localhost:8000/predict -d '{"x": [0.1, ...256 numbers]}'
"""

from __future__ import annotations

import torch

import servescope

FEATURES = 256


class MLP(servescope.Model):
    example = {"x": [0.0] * FEATURES}

    def load(self, device):
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )

    def validate(self, payload):
        x = payload.get("x") if isinstance(payload, dict) else None
        if not isinstance(x, list) or len(x) != FEATURES:
            raise ValueError(f'expected {{"x": [{FEATURES} numbers]}}')
        return x

    def preprocess(self, item):
        return torch.tensor(item, dtype=torch.float32)

    def postprocess(self, output):
        return {"logits": output.numpy()}  # orjson writes numpy arrays natively


app = servescope.serve(MLP(), max_batch_size=16)
