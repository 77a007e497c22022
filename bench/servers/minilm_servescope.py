"""servescope.serve on all-MiniLM-L6-v2: tokenizer per request, padded batches, pooling in infer."""

from minilm import load, pool, texts

import servescope


class Embedder(servescope.Model):
    example = {"text": "a short one"}
    examples = [{"text": t} for t in texts(4, seed=1)]

    def load(self, device):
        self.tokenizer, model = load()
        self.pad_values = {"input_ids": self.tokenizer.pad_token_id}
        return model

    def preprocess(self, request):
        return self.tokenizer(request["text"], truncation=True, max_length=256, return_tensors="pt")

    def infer(self, batch):
        return pool(self.model, batch)

    def postprocess(self, embedding):
        return {"embedding": embedding.numpy()}


app = servescope.serve(Embedder(), max_batch_size=16)
