"""The contract: the user writes the stages, the runtime does the rest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Model"]


class _End:
    def __repr__(self) -> str:
        return "Model.END"


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

    Batches are made by ``collate`` and taken apart by ``split``; both have defaults that fit
    what models take (see their docstrings) and may be overridden. ``infer(self, batch)`` may
    be overridden too; by default the loaded model is called on the batch (``model(**batch)``
    for a dict, as transformers models take it). ``postprocess(self, output, request)`` may
    take the validated request as a second argument (per-request options: ``top_k``, a
    threshold). ``self.model`` and ``self.device`` are set once ``load`` has returned.

    A model whose ``infer`` yields (one step for the whole batch: a decoder's next tokens) or
    whose ``postprocess`` yields (chunks of one answer) streams its answers: JSON lines, or
    Server-Sent Events for ``Accept: text/event-stream`` (docs/serve.md, "Streaming").
    """

    #: A payload the runtime uses to warm up (each batch size it will use) before /ready.
    example: Any = None
    #: More payloads to warm up with, e.g. a short and a long text: each runs at every batch
    #: size too, so the lengths that will be seen are compiled and allocated before /ready.
    examples: list[Any] = []
    #: What ``collate`` pads a field with when items' lengths differ (0 when not named): e.g.
    #: ``{"input_ids": tokenizer.pad_token_id}``. Masks are 0, so padding changes no result
    #: of a model that takes its attention mask.
    pad_values: dict[str, float] = {}

    model: Any = None
    device: str = "cpu"

    #: What ``postprocess`` returns, for a model whose ``infer`` yields steps, when this item's
    #: answer is complete (its last token was sent): its response ends now, while the batch's
    #: other items go on (and once every item has ended, the generator is closed).
    END: Any = _End()

    def load(self, device: str) -> Any:
        raise NotImplementedError("write load(self, device): build or read your model once and return it")

    def validate(self, payload: Any) -> Any:
        return payload

    def preprocess(self, item: Any) -> Any:
        return item

    def collate(self, inputs: list[Any]) -> Any:
        """The batch from the items' preprocessed inputs. By default tensors, numpy arrays and
        lists of numbers are stacked along a new first dimension, right-padded to the longest
        item with ``pad_values``; dicts and tuples field by field; a tokenizer's
        ``BatchEncoding`` is concatenated along its batch dimension of 1."""
        from .runtime import collate

        return collate(inputs, self.pad_values)

    def length(self, item_input: Any) -> int | None:
        """An item's length, for batching similar lengths together (None: do not group): by
        default the last dimension of its ``input_ids`` (or first tensor) for a tokenizer's
        output or a dict, the last dimension of a tensor or array, the length of a list of
        numbers; a model whose inputs all have one shape is never split."""
        x = item_input
        if isinstance(x, Mapping):
            x = x.get("input_ids", next(iter(x.values()), None))
        shape = getattr(x, "shape", None)
        if shape is not None:
            return int(shape[-1]) if len(shape) else None
        if isinstance(x, list) and x and isinstance(x[0], (int, float)):
            return len(x)
        return None

    def infer(self, batch: Any) -> Any:
        return self.model(**batch) if isinstance(batch, Mapping) else self.model(batch)

    def split(self, output: Any, n: int) -> list[Any]:
        """The batch's output as one output per item: tensors and arrays along the first
        dimension, dicts and tuples field by field, lists item by item."""
        from .runtime import split

        return split(output, n)

    def postprocess(self, output: Any) -> Any:
        return output
