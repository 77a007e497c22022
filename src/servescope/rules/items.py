"""A request's items through the model one call at a time (``[model.encode(t) for t in
texts]``): the saving of one call for all of them is measured by trying it on the endpoint
(doctor/experiments/items.py), at one client, where the lever is the request's own code."""

from __future__ import annotations

from ..doctor.evidence import ONE_CALL_EACH, Evidence, MissingEvidence
from ..report import Finding
from .savings import measured_or_estimated

__all__ = ["per_item_calls"]

#: why the experiment found the calls are not items one call could take (said in its why-not):
#: each takes an earlier call's output, or their inputs do not line up even padded (a
#: decoder's steps with their cache, images at two sizes)
CONCLUSIVE = ("the calls depend on each other", "do not line up in one call")

#: the call over every item of the request, in each library's idiom
_ONE_CALL = {
    "sentence-transformers": "vectors = model.encode(texts, batch_size=32)        # every text of the request in one call",
    "transformers.pipeline": "outputs = pipe(texts, batch_size=16)                # every text of the request in one call",
    "torch": (
        "inputs = tokenizer(texts, padding=True, truncation=True, return_tensors='pt')   # or torch.stack(items)\n"
        "with torch.inference_mode():\n"
        "    out = model(**inputs)                            # one forward for every item"
    ),
    "onnxruntime": "(y,) = session.run(None, {name: np.stack(items)})     # one run for every item",
    "xgboost": "y = booster.inplace_predict(np.vstack(rows))           # one call for every row",
    "lightgbm": "y = booster.predict(np.vstack(rows))                   # one call for every row",
}


def _fix(kinds: list[str], calls: list[str], frames: bool = False) -> str:
    lines = [_ONE_CALL[k] for k in kinds if k in _ONE_CALL]
    if "scikit-learn" in kinds:
        rows = "frame" if frames else "np.vstack(rows)"  # (a frame's column names are what a ColumnTransformer selects by)
        lines += [f"y = model.{c.split('.', 1)[1]}({rows})          # {c}: one call for every row" for c in calls if "." in c]
        if frames:
            lines.append("# the request's whole DataFrame (or pd.concat(row_frames)), not one row's frame per call: no iterrows")
    lines = lines or [_ONE_CALL["torch"]]
    return "# run the model once over all the request's items, not once per item in a loop\n" + "\n".join(dict.fromkeys(lines))


def per_item_calls(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    warm = ev.need("warm")
    fwd = warm.forwards
    if fwd.per_request < 2 or fwd.max_batch > 1 or warm.first_chunk_p50_ms is not None or warm.recompute_steps_per_request >= 1:
        return []  # (a streamed or decoded answer's steps depend on each other)
    if ev.tried("batch-items") is None:
        failed = ev.experiments.get("batch-items")
        if failed is not None and (failed.why_not == ONE_CALL_EACH or any(w in failed.why_not for w in CONCLUSIVE)):
            return []  # (measured: these calls are not items one call could take)
        raise MissingEvidence(
            f"each request made {fwd.per_request:g} model calls of batch 1; one call for all of them was not tried"
            + (f": {failed.why_not}" if failed is not None and failed.why_not else "")
        )
    saving = measured_or_estimated(ev, "batch-items", estimate_ms=None, estimated_from="")
    if not saving.ms:
        return []  # measured: one call for all the items is no faster here
    n = f"{fwd.per_request:g}"
    return [
        Finding(
            "per-item-calls",
            saving.severity(),
            f"Each request runs its {n} items through the model one call at a time",
            {"calls_per_request": fwd.per_request, "batch_sizes": fwd.batch_sizes, "calls": ", ".join(fwd.calls or fwd.modules)},
            fix=_fix(fwd.kinds, fwd.calls, fwd.frames > 0),
            saving_ms=saving.ms,
            detail=f"Every warm request made {n} model calls of batch 1, each on another input. " + saving.detail,
            **saving.fields(),
        )
    ]
