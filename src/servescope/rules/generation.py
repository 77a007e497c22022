"""Causes of a slow generated (decoded, often streamed) answer: one small function per cause,
as in causes.py."""

from __future__ import annotations

from ..doctor.evidence import Evidence
from ..report import Finding
from .savings import measured_or_estimated

__all__ = ["no_kv_cache"]

_CACHE_FIX = """\
# keep the decoder's cache: read the prompt once, then one new token a step
out = model(input_ids=ids, use_cache=True)
for _ in range(max_new_tokens):
    next_id = out.logits[:, -1:].argmax(-1)
    out = model(input_ids=next_id, past_key_values=out.past_key_values, use_cache=True)
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
