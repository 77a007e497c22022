"""The model's loading: loaded again on every request (model-load-per-request), and a first
request that pays what a warm-up at start-up would (cold-start). Rules as in causes.py."""

from __future__ import annotations

from typing import Any

from ..doctor.evidence import Evidence, MissingEvidence
from ..report import Finding
from .idioms import load_once_fix, warmup_fix
from .savings import _ms, measured_or_estimated, severity

__all__ = ["cold_start", "first_request_slow", "loaded_lazily", "loads_a_model", "model_load_per_request"]

#: A first request is slow when it is this many times the warm p50, this much slower, and
#: this many times the slowest warm request (it clears their tail: not noise).
COLD_RATIO, COLD_EXTRA_MS, COLD_OVER_TAIL = 3.0, 50.0, 1.5
#: The stages a warm-up at start-up (load, then one example through the handler) makes warm:
#: not the framework's own first-request work, nor the network.
WARMED_STAGES = ("load", "preprocess", "to_device", "infer", "to_host", "postprocess")


def loads_a_model(warm: Any) -> bool:
    """Whether the warm requests load a model (a loader, half of them at least) or build one
    (modules with weights: nn.Softmax() per request is not a model)."""
    return warm.loads_per_request >= 0.5 or (warm.constructed_per_request >= 1 and warm.params_built_per_request > 0)


def model_load_per_request(ev: Evidence) -> list[Finding]:
    warm = ev.need("warm")
    ev.need_probes("torch.load", "load_state_dict", "safetensors", "torch.jit.load", "from_pretrained", "SentenceTransformer", "Module.__init__")
    loads, built = warm.loads_per_request, warm.constructed_per_request
    if not loads_a_model(warm):
        return []
    what = ", ".join(warm.load_calls) or "nn.Module construction"
    if warm.load_ms_per_request is None:
        # doctor --pid on a server whose requests the samples could not tell apart: the load's
        # share of the server's time in requests is known, its ms per request are not
        share = (ev.stages.get("load") or {}).get("share") or 0.0
        sev, saving_ms, fields, timed = severity(share, 1.0), None, {}, None
        detail = (
            f"Sampled: loads took {share:.0%} of the server's time in requests, all through the run. Its requests came back "
            "to back, so the samples cannot tell one from the next: give --url for the ms per request."
        )
    else:
        timed = round(warm.load_ms_per_request + warm.construct_ms_per_request, 3)
        saving = measured_or_estimated(
            ev, "memoise-loaders", estimate_ms=timed,
            estimated_from="the load calls' and the construction's own time (a fresh model's slower first forward is not in it)",
        )  # fmt: skip
        sev, saving_ms, fields, detail = saving.severity(), saving.ms, saving.fields(), saving.detail
        detail += _another_process(ev, saving_ms)
    evidence = {
        "loads_per_request": loads,
        "modules_built_per_request": built,
        "weights_built_per_request": int(warm.params_built_per_request),
        "load_calls": what,
        "load_ms_per_request": timed,
        "p50_ms": ev.p50_ms,
    }
    if ev.cold is not None and ev.cold.repeat_p50_ms is not None:
        evidence["fresh_process_p50_ms"] = ev.cold.repeat_p50_ms
    return [
        Finding(
            "model-load-per-request",
            sev,
            "The model is loaded again on every request",
            evidence,
            fix=load_once_fix(warm.load_calls),
            saving_ms=saving_ms,
            detail=detail,
            **fields,
        )
    ]


#: a fresh process's p50 this many times this one's, or less than its inverse, is said
PROCESS_SPREAD = 1.15


def _another_process(ev: Evidence, saving_ms: float | None) -> str:
    """What a fresh process of the endpoint as written said of its p50, where it differs from
    this one's (both without the probes, one client): a load per request costs what its
    process's memory allocator makes of it. A 47-MB ONNX Runtime session built per request ran
    at 124 and 94 ms in two plain processes, and 77 ms after one 30-MB block was allocated and
    freed first (glibc then keeps blocks of that size instead of mapping them afresh); three
    gunicorn workers of it, 96-130 ms (docs/benchmarks.md, session 27)."""
    there = ev.cold.repeat_p50_ms if ev.cold is not None else None
    here = ev.concurrent.served_alone_p50_ms if ev.concurrent is not None else None
    if not there or not here or 1 / PROCESS_SPREAD <= there / here <= PROCESS_SPREAD:
        return ""
    busy = ev.machine is not None and ev.machine.busy
    other = f" If the difference is all in the loads, the saving there is about {_ms(max((saving_ms or 0.0) + there - here, 0.0))} ms." if saving_ms else ""
    return (
        f" A fresh process of the endpoint as written ran at p50 {_ms(there)} ms against {_ms(here)} ms in this one (both without "
        "the probes, one client, a few requests, measured a while apart): what a load per request costs may depend on the "
        "process (what its memory allocator kept of the buffers freed before), so each worker of a server may pay its own." + other
        + (" Other processes kept cores busy during the doctor's run: part of the difference may be theirs." if busy else "")
    )


def first_request_slow(first_ms: float, p50_ms: float, warm_max_ms: float | None) -> bool:
    return first_ms >= COLD_RATIO * p50_ms and first_ms - p50_ms >= COLD_EXTRA_MS and first_ms >= COLD_OVER_TAIL * (warm_max_ms or 0.0)


def loaded_lazily(cold_loads: int, cold_params_built: int, warm: Any) -> bool:
    """The first request loaded or built the model, and the warm ones did not."""
    return (cold_loads > 0 or cold_params_built > 0) and warm.loads_per_request < 0.5 and warm.params_built_per_request == 0


def _warmed_ms(ev: Evidence) -> float | None:
    """What a warm-up at start-up would take off the first request: its own time in the
    stages the warm-up runs (loading, the model, the handler's work), beyond a warm request's."""
    stages = ev.cold.stage_ms if ev.cold is not None else {}
    if not stages:
        return None
    return sum(max(stages.get(s, 0.0) - ((ev.stages.get(s) or {}).get("mean_ms") or 0.0), 0.0) for s in WARMED_STAGES)


def cold_start(ev: Evidence) -> list[Finding]:
    cold, warm = ev.need("cold"), ev.need("warm")
    p50 = ev.p50_ms
    if cold.error or not p50:
        return []
    lazy = loaded_lazily(cold.loads, cold.params_built, warm)
    slow = first_request_slow(cold.latency_ms, p50, warm.max_ms)
    if not (lazy or slow):
        return []
    extra = max(cold.latency_ms - p50, 0.0)
    again = ""
    if not lazy:
        # one slow sample, no load to explain it: it must happen again in a fresh process
        if cold.repeat_ms is None:
            raise MissingEvidence(
                f"the first request took {cold.latency_ms:.0f} ms ({cold.latency_ms / p50:.0f}x the p50) with no load to explain it, "
                "and a second first request in a fresh process "
                + (f"failed ({cold.repeat_error})" if cold.repeat_error else "was not sent (the doctor ran in-process)")
                + ": one sample is not claimed as a cold start"
            )
        if not first_request_slow(cold.repeat_ms, cold.repeat_p50_ms or p50, None):
            return []  # the fresh process's first request was not slow: the first sample was noise
        extra = min(extra, max(cold.repeat_ms - (cold.repeat_p50_ms or p50), 0.0))
        again = f" A second first request, in a fresh process, took {cold.repeat_ms:.0f} ms too."
    warmed = _warmed_ms(ev)
    saving, basis = extra, "the first request less the warm p50"
    if warmed is not None and warmed > 0:
        saving = min(warmed, extra) if not lazy else warmed
        basis = "the first request's own time in loading, the model and the handler beyond a warm request's (what a warm-up at start-up runs)"
    if cold.latency_ms >= 10 * p50 and saving >= 200:
        sev = "high"
    elif slow or saving >= COLD_EXTRA_MS:
        sev = "medium"
    else:
        sev = "low" if saving >= 0.1 * p50 else "info"
    evidence = {
        "first_ms": round(cold.latency_ms, 2),
        "p50_ms": p50,
        "ratio": round(cold.latency_ms / p50, 1),
        "loaded_on_first_request": lazy,
    }
    if lazy:
        evidence["first_request_load_calls"] = ", ".join(cold.load_calls) or "nn.Module construction"
    if cold.repeat_ms is not None:
        evidence["fresh_process_first_ms"] = cold.repeat_ms
    return [
        Finding(
            "cold-start",
            sev,
            "The first request " + ("loads the model" if lazy else "is far slower than the rest") + ": no warm-up",
            evidence,
            fix=warmup_fix(warm.forwards.kinds),
            saving_ms=round(saving, 2),
            saving_per="first request",
            saving_basis="estimated",
            saving_load="first request",
            detail="Only the first request pays this; "
            + ("the model is loaded lazily by it." if lazy else "first-call initialisation (allocation, tracing, kernels) runs in it.")
            + again
            + f" Estimated from {basis}.",
        )
    ]
