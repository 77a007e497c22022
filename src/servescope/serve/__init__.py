"""``servescope.serve``: a serving runtime with the usual fixes built in.

    class Embedder(servescope.Model):
        example = {"text": "hello"}
        def load(self, device): ...
        def preprocess(self, item): ...
        def postprocess(self, output): ...

    app = servescope.serve(Embedder(), max_batch_size=32)    # an ASGI app: uvicorn module:app

Loads once (before readiness, off the event loop), moves the model to the best device,
``eval()``, every forward under ``torch.inference_mode()``, warm-up at each batch size before
/ready, dynamic batching without waiting on a lone request, one device-to-host copy per batch,
orjson (or msgpack), Server-Timing on every response, /metrics, a bounded queue (503) and a
deadline (504).
"""

from __future__ import annotations

from typing import Any

from .app import ServeApp
from .model import Model

__all__ = ["Model", "ServeApp", "serve"]


def serve(model: Model, **options: Any) -> ServeApp:
    """The ASGI app serving ``model``; options as ``ServeApp`` (keyword-only, validated now)."""
    return ServeApp(model, **options)
