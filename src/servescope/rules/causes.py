"""One function per cause: ``rule(evidence) -> list[Finding]``.

Presence is decided by evidence that does not move with timing noise (a loader ran on warm
requests, a forward ran in training mode or on the event loop); timings size the saving
and the severity, so a cause that is there is listed every run (at ``info`` when it costs
nothing measurable). A rule that needs a measurement the run does not have calls
``ev.need(...)``, which raises ``MissingEvidence``: the report lists it as not checked.
"""

from __future__ import annotations

import re

from ..doctor.evidence import Evidence
from ..report import Finding
from ..doctor.failures import known_failure
from ..doctor.sampler import CALLED_FROM, user_place
from .idioms import repeated_fix
from .savings import Saving, measured_or_estimated, severity

#: Thresholds (docs/doctor.md).
NO_BATCHING_GAIN, NO_BATCHING_FLOOR_MS = 1.3, 0.2
LOOP_BUSY_SHARE, LOOP_BUSY_RUN_MS, LOOP_STALL_HIGH_MS = 0.3, 20.0, 50.0
GIL_SCALING, GIL_CORES, GIL_WAIT_MS, GIL_FLOOR_MS, GIL_SHARE = 0.7, 0.75, 1.0, 1.0, 0.1
GIL_MIN_REQUEST_MS = 5.0
#: requests that could run at once (the CPUs over the cores one request keeps busy alone) under
#: which more processes have too little to gain for the GIL to be what holds them
GIL_MIN_WIDTH = 1.5
GIL_ONE_CORE = 1.15  # a process's CPU, in cores, past which more than one thread ran at once
GIL_IDLE_SHARE = 0.5  # of the cores the process left unused, the share that must have been idle
FAILING_HIGH = 0.1
REPEATED_SHARE = 0.01
PADDING_SHARE = 0.5
MODEL_CALLS = ("torch module hooks", "onnxruntime", "scikit-learn", "sentence-transformers", "transformers.pipeline")


def failing_requests(ev: Evidence) -> list[Finding]:
    warm, conc = ev.need("warm"), ev.concurrent
    sent = warm.requests + (conc.requests if conc else 0)
    failed = warm.errors + (conc.errors if conc else 0)
    if not failed:
        return []
    share = max(warm.errors / max(warm.requests, 1), (conc.errors / max(conc.requests, 1)) if conc else 0.0)
    only_concurrent = warm.errors == 0
    raised = ev.app_exceptions
    known = next((k for k in map(known_failure, raised) if k), None)
    fix = (
        "# the figures above are from the requests that succeeded; fix the failures first\n"
        + ("# failing only under concurrency: shared state that is not thread-safe (a tokenizer,\n"
           "# a cache, a model moved per request); guard it or give each worker its own"
           if only_concurrent else "# run one request by hand with the same payload to see the traceback")
    )  # fmt: skip
    if known is not None:  # the exception says what it is: its cause, then the code that fixes it
        fix = known
    return [
        Finding(
            "failing-requests",
            "high" if share >= FAILING_HIGH or only_concurrent else "medium",
            "Some requests fail" + (" only when several run at once" if only_concurrent else ""),
            {
                "failed": failed,
                "sent": sent,
                "warm_failed": warm.errors,
                "concurrent_failed": conc.errors if conc else 0,
                "first_errors": " | ".join(warm.errors_sample) or "-",
                **({"raised": " | ".join(raised)} if raised else {}),
            },
            fix=fix,
            detail="Failed requests are kept out of the latency figures and counted by kind under Errors."
            + (f" The endpoint raised (its server's log): {'; '.join(raised)}." if raised else ""),
        )
    ]


def model_not_on_accelerator(ev: Evidence) -> list[Finding]:
    env, warm = ev.need("environment"), ev.need("warm")
    if not env.cuda_available:
        return []
    ev.need_probes("torch module hooks")
    fwd = warm.forwards
    if not fwd.count or any(d.startswith("cuda") for d in fwd.param_devices):
        return []
    probe = ev.batch_probe
    return [
        Finding(
            "model-not-on-accelerator",
            "high",
            "A GPU is available but the model runs on the CPU",
            {"param_devices": ", ".join(fwd.param_devices), "forward_ms": probe.forward_ms if probe else None},
            fix="device = torch.device('cuda')\nmodel = model.to(device).eval()   # once, at start-up\nx = x.to(device, non_blocking=True)",
            saving_ms=None,
        )
    ]


def repeated_transfer(ev: Evidence) -> list[Finding]:
    warm = ev.need("warm")
    ev.need_probes("Tensor.", "Module.to", "Module.cuda")
    copies = warm.h2d_per_request + warm.d2h_per_request
    problems: dict[str, float] = {}
    if warm.module_moves_per_request >= 1:
        problems["model_moved_per_request"] = warm.module_moves_per_request
    if warm.small_copies_per_request >= 4:
        problems["small_copies_per_request"] = warm.small_copies_per_request
    if warm.unpinned_async_per_request >= 1:
        problems["non_blocking_from_unpinned"] = warm.unpinned_async_per_request
    if warm.syncs_per_request >= 4:
        problems["sync_points_per_request"] = warm.syncs_per_request
    if copies > 4:
        problems["copies_per_request"] = copies
    if not problems:
        return []
    saving = sum((ev.stages.get(s) or {}).get("mean_ms") or 0.0 for s in ("to_device", "to_host"))
    return [
        Finding(
            "repeated-transfer",
            severity(saving, ev.p50_ms),
            "Host<->device copies are done piecemeal or synchronously",
            {**problems, "copy_bytes_per_request": warm.copy_bytes_per_request, "transfer_ms": round(saving, 3)},
            fix=(
                "# one copy in, one copy out, per batch\n"
                "x = torch.stack(items).pin_memory().to(device, non_blocking=True)\n"
                "y = model(x)\n"
                "y = y.cpu()            # once; no .item()/.tolist() per element on the GPU\n"
                "# and move the model once at start-up, never per request"
            ),
            saving_ms=round(saving, 3) or None,
        )
    ]


def training_mode(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if not fwd.training:
        return []
    probe = ev.batch_probe
    ratio = (probe.train_ratio if probe else None) or 1.0
    forward = (probe.forward_ms if probe else None) or 0.0
    changes = fwd.training_changes_output > 0
    # only dropout and batch-norm compute differently in training mode: without them the
    # flag costs nothing, whatever a timing ratio says
    estimate = max(forward * (1 - 1 / ratio), 0.0) if changes and ratio > 1 else 0.0
    saving = measured_or_estimated(ev, "eval-mode", estimate_ms=round(estimate, 3) or None, estimated_from="the batch probe (batch 1, train vs eval)")
    sev = "high" if changes else saving.severity()
    return [
        Finding(
            "training-mode",
            sev,
            "The model runs in training mode" + (": dropout/batch-norm change its answers" if changes else ""),
            {"forwards_in_training_mode": fwd.training, "changes_output": changes, "train_over_eval": ratio},
            fix="model.eval()   # once, after loading",
            saving_ms=saving.ms or None,
            detail=(
                "In training mode dropout drops activations at random and batch-norm uses batch statistics: results vary from call to call."
                if changes
                else "No dropout or batch-norm here, so the answers are the same; eval() is still the mode to serve in."
            )
            + (" " + saving.detail if saving.detail else ""),
            **(saving.fields() if saving.ms else {}),
        )
    ]


def grad_enabled(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if not fwd.grad:
        return []
    probe = ev.batch_probe
    ratio = (probe.grad_ratio if probe else None) or 1.0
    forward = (probe.forward_ms if probe else None) or 0.0
    estimate = forward * (1 - 1 / ratio) if ratio > 1 else 0.0
    saving = measured_or_estimated(ev, "inference-mode", estimate_ms=round(estimate, 3) or None, estimated_from="the batch probe (batch 1, autograd on vs off)")
    sev = saving.severity()
    return [
        Finding(
            "grad-enabled",
            sev,
            "The forward runs with autograd on",
            {"forwards_with_grad": fwd.grad, "grad_over_inference_mode": ratio, "batch_sizes": fwd.batch_sizes},
            fix="with torch.inference_mode():\n    y = model(x)",
            saving_ms=saving.ms or None,
            detail="Autograd records a graph and keeps activations alive for a backward pass that never comes."
            + (" Here it costs nothing measurable, but it holds memory." if sev == "info" else "")
            + (" " + saving.detail if saving.detail else ""),
            **(saving.fields() if saving.ms else {}),
        )
    ]


_STAGE_FIX = {
    "preprocess": "# do per-request preparation in bulk: vectorise (numpy/torch ops, not Python loops),\n# cache what does not change between requests, and keep it off the event loop",
    "postprocess": "# avoid .tolist() and Python loops over big tensors; return numpy arrays\n# (orjson serialises them natively) or raw bytes",
    "serialize": (
        "# serialise with orjson and return the bytes, skipping FastAPI's jsonable_encoder:\n"
        "from fastapi import Response\n"
        "return Response(orjson.dumps({'vector': y.numpy()}, option=orjson.OPT_SERIALIZE_NUMPY),\n"
        "                media_type='application/json')"
    ),
}
_STAGE_ID = {"preprocess": "slow-preprocess", "postprocess": "slow-postprocess", "serialize": "slow-serialization"}
_STAGE_WORDS = {"preprocess": "Preprocessing", "postprocess": "Postprocessing", "serialize": "Serialization"}


#: the user's own hot line, by what it does: the idiom that replaces it
_LINE_FIXES = (
    (("getdata(", "getpixel("), "x = np.asarray(img, dtype=np.float32)      # the image's pixels as one array, read in C: no Python list of tuples"),
    (("iterrows(", "itertuples(", ".apply("), "x = frame[COLUMNS].to_numpy(dtype=np.float32)   # whole columns at once, not row by row"),
    ((".tolist()",), "out = y.numpy()          # keep the array (orjson serialises numpy natively), no Python list of floats"),
    (("sorted(",), "top = np.argpartition(-scores, k)[:k]; top = top[np.argsort(-scores[top])]   # top-k without sorting everything in Python"),
    (("cosine", "dot(", " @ "), "scores = corpus_embeddings @ query          # one matmul over every row, not a Python loop of dot products"),
    (("sum(", "+=", "math."), "y = np.add.reduce(x, axis=1)   # one numpy call over the whole array instead of a Python loop (np.sum, np.where, broadcasting)"),
    # a loop whose work is not clearly numbers (strings, sets, dicts): numpy is not its answer
    (("for ", "zip(", "map(", "range("), "# Python runs this line once per item on every request: build what does not depend on the\n"
     "# request (a table, a vocabulary's n-grams, a lookup) once, at start-up, and make numbers numpy arrays"),
)


def _where(hot: str) -> str:
    """A hot spot's place: ``"app.py:21 prepare (70% of 90 samples); ..."`` -> ``"app.py:21 prepare"``."""
    return hot.split(";")[0].strip().split(" (")[0]


def _own_line(where: str, line: str, library: str = "", rank: str = "") -> str | None:
    """The user's own hot line quoted, with the idiom that replaces it (None: no idiom fits);
    with ``library``, the hot spot is that library code, and ``where`` is the user's line that
    calls it; ``rank`` is said after the place (its share, where it is not first)."""
    idiom = next((fix for keys, fix in _LINE_FIXES if any(k in line for k in keys)), None)
    if idiom is None:
        return None
    said = f"in {library}, called from your line {where.split(' ')[0]}" if library else f"your own line, {where.split(' ')[0]}"
    return f"# the hot spot is {said}{rank}:\n#     {line}\n{idiom}"


#: a stage's hot line is quoted as the work to change only where the stage is this share of
#: the request or more (or its share is not known)
OWN_LINE_STAGE_SHARE = 0.05


def own_line_fix(ev: Evidence) -> str | None:
    """The idiom for the user's own hot line in the stage that takes longest of those whose hot
    line the sampler found in their code (gil-contention's fix names it too: the Python work
    that holds the GIL is that line)."""
    shares = {n: (ev.stages.get(n) or {}).get("share") for n in set(ev.hot_lines) | set(ev.hot_spot_lines)}
    for name in sorted(shares, key=lambda n: -(shares[n] or 0.0)):
        if shares[name] is not None and shares[name] < OWN_LINE_STAGE_SHARE:
            continue  # (a line that `.tolist()`s a model call's answer, sampled once in a 1% stage, is not the work)
        hot, line = ev.hot_spots.get(name), ev.hot_lines.get(name)
        own = _own_line(_where(hot), line) if hot and line and ev.hot_spots_in_user_code.get(name, False) else None
        if own is None and hot:
            own = _next_place_fix(hot, ev.hot_spot_lines.get(name, {}))
        if own is not None:
            return own
    return None


#: a place after the first in a hot spot, with this share of the time or more, may be the one
#: whose idiom is quoted: a C call that holds the GIL is sometimes sampled on the line after it
#: (the first GIL release is there), which then comes first with no idiom of its own
NEXT_PLACE_SHARE = 25


def _next_place_fix(hot: str, lines: dict[str, str]) -> str | None:
    """The idiom of the first user's line after the top place of ``hot`` that has one and
    holds ``NEXT_PLACE_SHARE``% of the time or more."""
    for entry in hot.split("; ")[1:]:
        share = re.search(r"\((\d+)% of the time", entry)
        text = lines.get(user_place(entry))
        if share and int(share.group(1)) >= NEXT_PLACE_SHARE and text:
            library, _, caller = entry.split(" (")[0].partition(CALLED_FROM)
            rank = f" ({share.group(1)}% of the time, second in the hot spot)"
            own = _own_line(caller, text, library, rank) if caller else _own_line(library, text, rank=rank)
            if own is not None:
                return own
    return None


def fix_for_hot_spot(stage_name: str, hot: str, user_code: bool, line: str | None = None, lines: dict[str, str] | None = None) -> str:
    """The fix that fits what the stage's hot spot is, naming the user's line (and, with
    ``line``, its text) where it is theirs; with ``lines`` (each of the hot spot's places that
    is the user's line -> its text), an idiom that fits a line in second place is quoted too."""
    where = _where(hot)
    own = _own_line(where, line) if user_code and line else None
    if own is None and lines:
        own = _next_place_fix(hot, lines)
    if own is not None:
        return own
    library, called, caller = where.partition(CALLED_FROM)  # library code, called from the user's line
    hot = re.sub(CALLED_FROM + r"[^;(]*", "", hot)  # (the libraries' frames alone say which library it is)
    if "pandas" in hot:
        return (
            f"# the hot spot is pandas ({where}): a DataFrame built per request costs far more than the model\n"
            "x = np.asarray([[row['a'], row['b'], row['c']] for row in rows], dtype=np.float32)\n"
            "y = model.predict(x)   # estimators take arrays; keep column order fixed at start-up"
        )
    if "PIL" in hot or "Image" in hot:
        return (
            f"# the hot spot is image handling ({where}): decode and resize once, then vectorise\n"
            "img = Image.open(io.BytesIO(data)).convert('RGB').resize((224, 224))\n"
            "x = (np.asarray(img, dtype=np.float32) / 255 - MEAN) / STD   # broadcasting, no per-pixel loops"
        )
    if any(k in hot for k in ("tolist", "jsonable_encoder", "json", "encoders.py", "render")):
        return _STAGE_FIX["serialize"] if stage_name == "serialize" else _STAGE_FIX["postprocess"]
    if called and line:
        own = _own_line(caller, line, library)  # the user's call is the line to change (`df.apply(f, axis=1)`)
        if own is not None:
            return own
        return f"# the hot spot is library code ({library}), called from your line {caller.split(' ')[0]}:\n#     {line}\n{_STAGE_FIX[stage_name]}"
    if user_code:  # (what the code does is not known: each way out is said as a question)
        quoted = f"\n#     {line}" if line else ""
        return (
            f"# the hot spot is your own Python code ({where}):{quoted}\n"
            "# does it depend on the request? if not (a table, a vocabulary, n-grams), build it once, at start-up;\n"
            "# is it numbers? one numpy call over the whole array instead of a Python loop:\n"
            "scores = corpus_embeddings @ query            # a matmul, not zip/sum per row\n"
            "top = np.argpartition(-scores, k)[:k]         # top-k without sorting everything\n"
            "top = top[np.argsort(-scores[top])]"
        )
    return _STAGE_FIX[stage_name]


#: what a fix of a slow stage is estimated to save of the stage's time
STAGE_SAVED = 0.8


def slow_stages(ev: Evidence) -> list[Finding]:
    out = []
    for name, fid in _STAGE_ID.items():
        s = ev.stages.get(name)
        if not s or s.get("share") is None:
            continue
        share, mean, typical = s["share"], s.get("mean_ms"), s.get("p50_ms")
        # the typical request's share: a few slow ones (a pause, a neighbour's burst) can make a
        # stage look slow, or a fast one look fast: read it from the requests one by one
        if name in ev.stage_shares:
            share = ev.stage_shares[name]
        elif typical is not None and ev.p50_ms:  # (no rows: its p50 over the request's)
            share = round(min(share, typical / ev.p50_ms), 4)
        if typical is None:
            typical = mean
        if share < 0.25 or (typical is not None and typical < 1.0):
            continue  # (no mean: doctor --pid on requests it could not tell apart; the share is known)
        evidence = {"mean_ms": mean, "p50_ms": s.get("p50_ms"), "p95_ms": s["p95_ms"], "share": share}
        if ev.hot_spots.get(name):
            evidence["hot_spot"] = ev.hot_spots[name]
        fix = (
            fix_for_hot_spot(name, ev.hot_spots[name], ev.hot_spots_in_user_code.get(name, False), ev.hot_lines.get(name), ev.hot_spot_lines.get(name))
            if ev.hot_spots.get(name) else _STAGE_FIX[name]
        )  # fmt: skip
        title = f"{_STAGE_WORDS[name]} takes {share * 100:.0f}% of each request"
        if typical is None:  # (the share is known, the milliseconds are not: sized as a share)
            out.append(Finding(fid, severity(STAGE_SAVED * share, 1.0), title, evidence, fix=fix))
            continue
        saving = Saving(ms=round(typical * STAGE_SAVED, 3), basis="estimated", load="c=1", p50_ms=ev.p50_ms,
                        detail=f"Estimated as {STAGE_SAVED:.0%} of the stage's time in the median request (its p50), at c=1.")  # fmt: skip
        out.append(Finding(fid, saving.severity(), title, evidence, fix=fix, saving_ms=saving.ms, detail=saving.detail, **saving.fields()))
    return out


def repeated_work(ev: Evidence) -> list[Finding]:
    ev.need_probes(*MODEL_CALLS)
    r = ev.need("repeated")
    if r.calls_per_request < 1 or r.ms_per_request < REPEATED_SHARE * ev.p50_ms:
        return []
    saving = measured_or_estimated(ev, "memoise-repeated", estimate_ms=round(r.ms_per_request, 3), estimated_from="the repeated calls' own time")
    return [
        Finding(
            "repeated-work",
            saving.severity(),
            "The same model call on the same inputs runs on every request",
            {
                "calls_per_request": r.calls_per_request,
                "ms_per_request": r.ms_per_request,
                "modules": ", ".join(r.modules),
                "batch_sizes": r.batch_sizes,
            },
            fix=repeated_fix(r.kinds, r.calls),
            saving_ms=saving.ms,
            detail="Its inputs (shape, dtype and a sample of the values) were the same in every request, "
            "including one sent with the payload's texts and numbers changed. " + saving.detail,
            **saving.fields(),
        )
    ]


def padding_waste(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if fwd.pad_share is None or fwd.pad_share < PADDING_SHARE:
        return []
    saving = measured_or_estimated(
        ev, "trim-padding", estimate_ms=round(fwd.padding_ms_per_request or 0.0, 3),
        estimated_from="each masked call's time x its padding share (cost taken as linear in the length)",
    )  # fmt: skip
    return [
        Finding(
            "padding-waste",
            saving.severity(),
            f"{fwd.pad_share * 100:.0f}% of the model's input is padding",
            {"pad_share": fwd.pad_share, "padding_ms_per_request": fwd.padding_ms_per_request},
            fix=(
                "# pad to the longest text in the batch, not to a fixed length\n"
                "inputs = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors='pt')\n"
                "# (padding='max_length' pads every short text to max_length tokens)"
            ),
            saving_ms=saving.ms,
            detail="The attention mask is mostly zeros: the model computes over padding tokens and throws the result away. " + saving.detail,
            **saving.fields(),
        )
    ]
