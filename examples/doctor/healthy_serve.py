"""Healthy: the same MLP on servescope.serve (loaded once, warmed up, batched)."""

import torch

import servescope


class MLP(servescope.Model):
    example = {"x": [0.0] * 256}

    def load(self, device):
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)
        )

    def validate(self, payload):
        return payload["x"]

    def preprocess(self, item):
        return torch.tensor(item, dtype=torch.float32)

    def postprocess(self, output):
        return {"scores": output.numpy()}


app = servescope.serve(MLP(), max_batch_size=16)
