"""Causes of a slow generated (decoded, often streamed) answer: one small function per cause,
as in causes.py."""

from __future__ import annotations

from ..doctor.evidence import Evidence
from ..report import Finding
from .savings import measured_or_estimated

__all__ = ["no_kv_cache", "whole_answer_decoded"]

_CACHE_FIX = """\
# keep the decoder's cache: read the prompt once, then one new token a step
out = model(input_ids=ids, use_cache=True)
for _ in range(max_new_tokens):
    next_id = out.logits[:, -1:].argmax(-1)
    out = model(input_ids=next_id, past_key_values=out.past_key_values, use_cache=True)  # cache= in transformers 5
# or let transformers do it, streamed:
#   streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
#   Thread(target=model.generate, kwargs=dict(**inputs, max_new_tokens=n, streamer=streamer)).start()"""


def no_kv_cache(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    warm = ev.need("warm")
    if warm.recompute_steps_per_request < 1:
        return []
    saving = measured_or_estimated(
        ev, "kv-cache", estimate_ms=round(warm.recompute_ms_per_request, 3) or None,
        estimated_from="the steps' own times (each step beyond the shortest one's; with a cache a step reads one new token, so more is saved as the sequence grows)",
    )  # fmt: skip
    return [
        Finding(
            "no-kv-cache",
            saving.severity(),
            "Each generated token recomputes the whole sequence (no cache of the tokens before)",
            {
                "steps_per_request": warm.recompute_steps_per_request,
                "ids_length_first": warm.recompute_seq_first,
                "ids_length_last": warm.recompute_seq_last,
                "recompute_ms_per_request": warm.recompute_ms_per_request,
            },
            fix=_CACHE_FIX,
            saving_ms=saving.ms or None,
            detail="The model is called with token ids one longer at every step and no `past_key_values`: step k "
            "runs attention and the MLPs over all k tokens again, so a reply of n tokens costs about n^2/2 token-steps "
            "instead of n. " + saving.detail,
            **(saving.fields() if saving.ms else {}),
        )
    ]


_DECODE_FIX = """\
# turn only the new token into text, as transformers' streamers do
text = tokenizer.decode(new_ids, skip_special_tokens=True)   # the ids this step added
yield text
# or: streamer = TextIteratorStreamer(tokenizer, skip_prompt=True) and read it as generate() runs"""


def whole_answer_decoded(ev: Evidence) -> list[Finding]:
    ev.need_probes("tokenizer decode")
    warm = ev.need("warm")
    if warm.redecode_steps_per_request < 1:
        return []
    saving = measured_or_estimated(
        ev, "decode-new-tokens", estimate_ms=round(warm.redecode_ms_per_request, 3) or None,
        estimated_from="the decode calls' own times (each beyond the shortest one's)",
    )  # fmt: skip
    return [
        Finding(
            "whole-answer-decoded",
            saving.severity(),
            "The whole answer is turned into text again at every token",
            {"decodes_per_request": warm.redecode_steps_per_request, "ids_last": warm.redecode_ids_last,
             "redecode_ms_per_request": warm.redecode_ms_per_request},  # fmt: skip
            fix=_DECODE_FIX,
            saving_ms=saving.ms or None,
            detail="`tokenizer.decode` is called with the ids so far, one longer every step: a reply of n tokens "
            "decodes about n^2/2 tokens. " + saving.detail,
            **(saving.fields() if saving.ms else {}),
        )
    ]
