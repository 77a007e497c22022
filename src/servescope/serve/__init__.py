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
from .routes import Routes

__all__ = ["Model", "Routes", "ServeApp", "as_app", "model_of", "serve"]


def serve(model: Model | dict[str, Model], **options: Any) -> ServeApp | Routes:
    """The ASGI app serving ``model``; options as ``ServeApp`` (keyword-only, validated now).
    ``{path: model, ...}``: several models in one app, each at its own route (serve/routes.py)."""
    if isinstance(model, dict):
        return Routes(model, **options)
    return ServeApp(model, **options)


def as_app(obj: Any, *, name: str = "", **options: Any) -> ServeApp | Routes:
    """What ``servescope serve path:NAME`` serves: a ``Model`` subclass (built with no
    arguments), a ``Model`` instance (served with ``options``) or a ``serve()`` app (as it is:
    its options were set where it was made)."""
    from ..exceptions import ConfigError

    name = name or type(obj).__name__
    model = model_of(obj)
    if model is not None:
        return serve(model, **options)
    if not isinstance(obj, (ServeApp, Routes)):
        raise ConfigError(f"{name} is {type(obj).__name__}, not a servescope.Model subclass or a serve() app")
    if options:
        raise ConfigError(f"{name} is already a serve() app: set its options in the file, not here")
    return obj


def model_of(obj: Any) -> Model | None:
    """The ``Model`` that ``path:NAME`` names (a subclass built with no arguments, or an
    instance), or None when it names something else."""
    model = obj() if isinstance(obj, type) and issubclass(obj, Model) else obj
    return model if isinstance(model, Model) else None
