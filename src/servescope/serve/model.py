"""The contract: the user writes the stages, the runtime does the rest."""

from __future__ import annotations

from typing import Any

__all__ = ["Model"]


class Model:
    """Subclass it and write the stages your model needs.

        class Embedder(servescope.Model):
            example = {"text": "hello"}          # used to warm up before /ready

            def load(self, device):             # once per worker, before readiness
                return build_model().to(device)
            def validate(self, payload):        # optional: raise ValueError to answer 422
                return payload["text"]
            def preprocess(self, item):         # per item, off the event loop
                return tokenize(item)
            def postprocess(self, output):      # per item
                return {"embedding": output}

    ``infer(self, batch)`` may be overridden; by default the loaded model is called on the
    batch (items' tensors stacked along a new first dimension). ``self.model`` and
    ``self.device`` are set once ``load`` has returned.
    """

    #: A payload the runtime uses to warm up (each batch size it will use) before /ready.
    example: Any = None

    model: Any = None
    device: str = "cpu"

    def load(self, device: str) -> Any:
        raise NotImplementedError("write load(self, device): build or read your model once and return it")

    def validate(self, payload: Any) -> Any:
        return payload

    def preprocess(self, item: Any) -> Any:
        return item

    def infer(self, batch: Any) -> Any:
        return self.model(batch)

    def postprocess(self, output: Any) -> Any:
        return output
