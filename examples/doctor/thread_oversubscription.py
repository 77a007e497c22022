"""Cause: more intra-op threads than CPUs (a setting copied from a bigger machine)."""

import os

import torch

torch.set_num_threads(4 * (os.cpu_count() or 1))
torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(256, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).eval()


def predict(payload):
    x = torch.tensor(payload["x"], dtype=torch.float32).unsqueeze(0)
    with torch.inference_mode():
        y = MODEL(x)
    return {"scores": y[0].tolist()}
