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


class Words(Steps):
    """The same pace as text, for the OpenAI-compatible front: ``{"prompt", "max_tokens"}`` in
    (what ``Model.openai_request`` makes of an OpenAI request), a word per step out."""

    example = {"prompt": "hi", "max_tokens": 2}

    def validate(self, payload):
        if not isinstance(payload.get("max_tokens"), int) or payload["max_tokens"] < 1:
            raise servescope.InvalidPayload("max_tokens must be a whole number >= 1", field="max_tokens")
        return {"n": payload["max_tokens"]}

    def postprocess(self, step, request):
        step = int(step)
        return None if step < 0 else {"text": f"w{step} "}
