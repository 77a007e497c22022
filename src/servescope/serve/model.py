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

    # -- the OpenAI-compatible front (``serve(model, openai="name")``, docs/serve.md) ----------
    def openai_request(self, request: dict[str, Any], prompt: str) -> Any:
        """This model's payload for an OpenAI request (``prompt``: the completion's prompt, or
        the chat's messages as ``chat_prompt`` joins them): ``{"prompt", "max_tokens"}`` by
        default, as a generator like examples/serve/generate.py takes. Override it to carry
        more (temperature, stop ...) into ``validate``."""
        max_tokens = next((request[k] for k in ("max_tokens", "max_completion_tokens") if request.get(k) is not None), 16)
        return {"prompt": prompt, "max_tokens": max_tokens}

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """A chat's messages as one prompt: the model's ``tokenizer`` chat template when it has
        one, else each message on its own line as ``role: text``, ending with ``assistant:``."""
        tokenizer = getattr(self, "tokenizer", None)
        if getattr(tokenizer, "chat_template", None):
            return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        lines = []
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, list):  # parts: [{"type": "text", "text": ...}, ...]
                content = "".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
            if not isinstance(content, str):
                raise ValueError("each message needs a role and its content as text")
            lines.append(f"{m.get('role', 'user')}: {content}")
        return "\n".join(lines) + "\nassistant:"

    def openai_text(self, chunk: Any) -> str:
        """The text of one chunk ``postprocess`` returned (or of a whole answer): the chunk if it
        is a string, else its ``text``, ``token`` or ``content`` field."""
        if isinstance(chunk, str):
            return chunk
        if isinstance(chunk, Mapping):
            for key in ("text", "token", "content"):
                value = chunk.get(key)
                if isinstance(value, str):
                    return value
        return ""

    def count_tokens(self, text: str) -> int | None:
        """Tokens in a prompt, for the OpenAI front's ``usage.prompt_tokens``: by the model's
        ``tokenizer`` when it has one; None when it has none (the count is then left out)."""
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is None or not callable(tokenizer):
            return None
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
