"""The same model on servescope.serve."""

import torch
from mlp import FEATURES, build

import servescope


class MLP(servescope.Model):
    example = {"x": [0.0] * FEATURES}

    def load(self, device):
        return build()

    def validate(self, payload):
        return payload["x"]

    def preprocess(self, item):
        return torch.tensor(item, dtype=torch.float32)

    def postprocess(self, output):
        return {"logits": output.numpy()}


app = servescope.serve(MLP(), max_batch_size=16)
