"""LitServe with batching (max_batch_size 16, batch_timeout 5 ms) on all-MiniLM-L6-v2, padding
each batch with the tokenizer, as its docs show for text models."""

import sys

import litserve as ls
import torch
from minilm import load, pool


class API(ls.LitAPI):
    def setup(self, device):
        self.tokenizer, self.model = load()

    def decode_request(self, request):
        return request["text"]

    def batch(self, inputs):
        return self.tokenizer(inputs, padding=True, truncation=True, max_length=256, return_tensors="pt")

    def predict(self, batch):
        with torch.inference_mode():
            return pool(self.model, batch)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"embedding": output.tolist()}


if __name__ == "__main__":
    server = ls.LitServer(API(), max_batch_size=16, batch_timeout=0.005, accelerator="cpu")
    server.run(port=int(sys.argv[1]), generate_client_file=False)
