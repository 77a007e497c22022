"""A model that streams with a known pace: ``infer`` yields one step of the whole batch every
STEP_S seconds (``n`` steps per request), ``postprocess`` turns each into ``{"i": step}``."""

import time

import torch

import servescope

STEP_S = 0.05


class Steps(servescope.Model):
    example = {"n": 2}

    def load(self, device):
        return torch.nn.Identity()

    def preprocess(self, request):
        return torch.tensor(request["n"])

    def infer(self, batch):
        for step in range(int(batch.max())):
            time.sleep(STEP_S)
            yield torch.where(batch > step, step, -1)

    def postprocess(self, step, request):
        step = int(step)
        return None if step < 0 else {"i": step}
