"""A servescope.Model whose infer never returns for one input (tests/e2e/test_serve_e2e.py)."""

import time

import torch

import servescope


class Hangs(servescope.Model):
    example = {"x": [0.0, 0.0, 0.0, 0.0]}

    def load(self, device):
        return torch.nn.Linear(4, 2)

    def validate(self, payload):
        return payload["x"]

    def preprocess(self, item):
        return torch.tensor(item, dtype=torch.float32)

    def infer(self, batch):
        if (batch == 13).any():  # the input that hangs it, as a deadlock or a stuck device would
            time.sleep(3600)
        return self.model(batch)

    def postprocess(self, output):
        return {"y": output.tolist()}
