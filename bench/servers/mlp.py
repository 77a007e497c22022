"""The benchmark model (MLP 256-2048-2048-10), shared by every server variant."""

import torch

FEATURES = 256


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).eval()
