"""A servescope.Model whose load fails, as a missing checkpoint does (tests/e2e/test_serve_e2e.py)."""

import servescope


class BrokenLoad(servescope.Model):
    example = {"x": [0.0, 0.0, 0.0, 0.0]}

    def load(self, device):
        raise FileNotFoundError("no checkpoint at /models/ckpt.pt")
