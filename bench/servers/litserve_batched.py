"""LitServe with batching (max_batch_size 16, batch_timeout 5 ms), as its docs show."""

import litserve as ls
import torch
from mlp import build


class API(ls.LitAPI):
    def setup(self, device):
        self.model = build()

    def decode_request(self, request):
        return torch.tensor(request["x"], dtype=torch.float32)

    def batch(self, inputs):
        return torch.stack(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"logits": output.tolist()}


if __name__ == "__main__":
    import sys

    server = ls.LitServer(API(), max_batch_size=16, batch_timeout=0.005, accelerator="cpu")
    server.run(port=int(sys.argv[1]), generate_client_file=False)
