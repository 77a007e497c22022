"""From what a phase's requests did (their observations) to typed evidence: the model calls,
the loads, the calls repeated whatever the request."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from .attribution import construction_window
from .endpoints import Observation
from .evidence import Forwards, Repeated, Warm

__all__ = ["blas_threads", "chunk_gaps", "data_load_keys", "first_chunk_p50", "forwards_of", "model_loads", "repeated_of", "warm_of"]


def first_chunk_p50(ok: list[Observation]) -> float | None:
    """The p50 time to first chunk of streamed answers, when most answers were streamed."""
    firsts = [o.first_chunk_ms for o in ok if o.first_chunk_ms is not None]
    return round(float(np.percentile(firsts, 50)), 3) if firsts and len(firsts) * 2 >= len(ok) else None


def chunk_gaps(ok: list[Observation]) -> tuple[float | None, float | None]:
    """(p50, p95) of the gaps between streamed answers' consecutive chunks, as their readers
    waited for them; (None, None) when no answer came in two chunks or more."""
    gaps = [g for o in ok for g in o.chunk_gaps_ms]
    if not gaps:
        return None, None
    p50, p95 = np.percentile(gaps, [50, 95])
    return round(float(p50), 3), round(float(p95), 3)


#: a prefix recomputed this many steps in a row is a decoding loop without a cache
RECOMPUTE_STEPS = 4


def recomputed(calls: list[dict[str, Any]]) -> tuple[int, int | None, int | None, float]:
    """The longest run of model calls whose token ids grew by one each step with no cache:
    (steps, first length, last length, ms beyond each step at the run's shortest)."""
    return growing_run([(f.get("seq") if not f.get("cached") else None, f.get("ms", 0.0)) for f in calls])


def growing_run(steps: list[tuple[int | None, float]]) -> tuple[int, int | None, int | None, float]:
    """The longest run of ``(length, ms)`` steps whose length grew by one each step (None
    breaks a run): (steps, first length, last length, ms beyond each step at the run's
    shortest); (0, None, None, 0.0) for a run under ``RECOMPUTE_STEPS``."""
    best: list[tuple[int, float]] = []
    run: list[tuple[int, float]] = []
    for n, ms in steps:
        if n is None:
            run = []
            continue
        run = run + [(n, ms)] if run and n == run[-1][0] + 1 else [(n, ms)]
        best = run if len(run) > len(best) else best
    if len(best) < RECOMPUTE_STEPS:
        return 0, None, None, 0.0
    times = [ms for _, ms in best]
    return len(best), best[0][0], best[-1][0], sum(times) - len(times) * min(times)


def forwards_of(obs: list[Observation], skip: frozenset[str] = frozenset()) -> Forwards:
    def kept(o: Observation) -> list[dict[str, Any]]:
        return [f for f in o.evidence.get("forwards", []) if f.get("fp") is None or f.get("fp") not in skip]

    forwards = [f for o in obs for f in kept(o)]
    pads = [f["pad_share"] for f in forwards if f.get("pad_share") is not None]
    ok = [o for o in obs if o.error is None]
    per_request = [len(kept(o)) for o in ok]
    # the time spent on padding, per request: each masked call's time x its share of padding
    padded = [sum(f.get("ms", 0.0) * f["pad_share"] for f in kept(o) if f.get("pad_share") is not None) for o in ok]
    timed = [f["ms"] for f in forwards if "ms" in f]
    return Forwards(
        count=len(forwards),
        per_request=round(statistics.mean(per_request), 2) if per_request else 0.0,
        batch_sizes=sorted({f["batch"] for f in forwards if f.get("batch") is not None}),
        max_batch=max((f["batch"] or 0 for f in forwards), default=0),
        training=sum(1 for f in forwards if f["training"]),
        training_changes_output=sum(1 for f in forwards if f["training_changes_output"]),
        grad=sum(1 for f in forwards if f["grad"]),
        on_event_loop=sum(1 for f in forwards if f["on_event_loop"]),
        param_devices=sorted({f["param_device"] for f in forwards if f.get("param_device")}),
        input_devices=sorted({f["input_device"] for f in forwards if f.get("input_device")}),
        mean_ms=round(statistics.mean(timed), 4) if timed else None,
        modules=sorted({f["module"] for f in forwards}),
        kinds=sorted({f.get("kind", "torch") for f in forwards}),
        calls=sorted({f"{f['module']}.{f['method']}" for f in forwards if f.get("method")}),
        pad_share=round(statistics.mean(pads), 4) if pads else None,
        frames=sum(1 for f in forwards if f.get("frame")),
        padding_ms_per_request=round(statistics.mean(padded), 3) if pads and padded else None,
    )


def repeated_of(ok: list[Observation], varied: Observation) -> tuple[Repeated, frozenset[str]]:
    """The calls whose fingerprint was in every successful warm request and in the varied one."""
    per = [{f["fp"] for f in o.evidence.get("forwards", []) if f.get("fp")} for o in ok]
    constant = frozenset(set.intersection(*per) if per else set()) & {f["fp"] for f in varied.evidence.get("forwards", []) if f.get("fp")}
    calls = [[f for f in o.evidence.get("forwards", []) if f.get("fp") in constant] for o in ok]
    return (
        Repeated(
            calls_per_request=round(statistics.mean(len(c) for c in calls), 2) if calls else 0.0,
            ms_per_request=round(statistics.mean(sum(f.get("ms", 0.0) for f in c) for c in calls), 3) if calls else 0.0,
            modules=sorted({f["module"] for c in calls for f in c}),
            batch_sizes=sorted({f["batch"] for c in calls for f in c if f.get("batch") is not None}),
            kinds=sorted({f.get("kind", "torch") for c in calls for f in c}),
            calls=sorted({f"{f['module']}.{f['method']}" for c in calls for f in c if f.get("method")}),
        ),
        constant,
    )


def blas_threads() -> int | None:
    """The largest BLAS/OpenMP thread pool loaded in the process, when threadpoolctl (which
    scikit-learn brings) is there to ask; None otherwise."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    try:
        return max((int(p.get("num_threads") or 0) for p in threadpool_info()), default=None) or None
    except Exception:  # a library threadpoolctl cannot read
        return None


def _construct_ms(ev: dict[str, Any]) -> float:
    """Module construction (first to last ``nn.Module.__init__``) outside any loader's time
    (a ``from_pretrained`` builds its modules inside its own load time)."""
    window = construction_window(ev)
    if window is None or not ev.get("params_built"):
        return 0.0
    lo, hi = window
    inside = sum(max(0, min(b, hi) - max(a, lo)) for a, b in ev.get("load_windows", []))
    return max(hi - lo - inside, 0) / 1e6


def _mean(values: list[float]) -> float:
    return round(statistics.mean(values), 4) if values else 0.0


def model_loads(ev: dict[str, Any], data_keys: frozenset[int]) -> list[tuple[str, float]]:
    """A request's load calls, less those that read the request's own data (``data_keys``:
    their key changed when the request did)."""
    calls = ev.get("load_calls", [])
    keys = ev.get("load_keys", [])
    if not data_keys or len(keys) != len(calls):
        return list(calls)
    return [call for call, key in zip(calls, keys) if key not in data_keys]


def data_load_keys(ok: list[Observation], varied: Observation) -> frozenset[int]:
    """The keys of load calls made with the same arguments in every warm request (the same
    body) and not in the request with the payload varied: they read the request's data."""
    per = [{k for k in o.evidence.get("load_keys", []) if k is not None} for o in ok]
    if not per:
        return frozenset()
    return frozenset(set.intersection(*per) - set(varied.evidence.get("load_keys", [])))


def warm_of(obs: list[Observation], data_keys: frozenset[int] = frozenset()) -> Warm:
    ok = [o for o in obs if o.error is None]

    def per(key: str) -> float:
        return round(statistics.mean(o.evidence.get(key, 0) for o in ok), 3) if ok else 0.0

    loads = [model_loads(o.evidence, data_keys) for o in ok]
    decode = [recomputed(o.evidence.get("forwards", [])) for o in ok]
    decoding = [d for d in decode if d[0]]
    texts = [growing_run(o.evidence.get("decodes", [])) for o in ok]

    return Warm(
        redecode_steps_per_request=_mean([d[0] for d in texts]),
        redecode_ms_per_request=_mean([d[3] for d in texts]),
        redecode_ids_last=max((d[2] for d in texts if d[0]), default=None),
        recompute_steps_per_request=_mean([d[0] for d in decode]),
        recompute_seq_first=decoding[0][1] if decoding else None,
        recompute_seq_last=max(d[2] for d in decoding) if decoding else None,
        recompute_ms_per_request=_mean([d[3] for d in decode]),
        requests=len(obs),
        errors=sum(1 for o in obs if o.error),
        p50_ms=round(float(np.percentile([o.latency_ms for o in ok], 50)), 4) if ok else None,
        p90_ms=round(float(np.percentile([o.latency_ms for o in ok], 90)), 4) if ok else None,
        max_ms=round(max(o.latency_ms for o in ok), 4) if ok else None,
        first_chunk_p50_ms=first_chunk_p50(ok),
        chunk_gap_p50_ms=chunk_gaps(ok)[0],
        chunk_gap_p95_ms=chunk_gaps(ok)[1],
        loads_per_request=round(statistics.mean(len(c) for c in loads), 3) if loads else 0.0,
        load_ms_per_request=_mean([sum(ms for _, ms in c) for c in loads]),
        load_calls=sorted({label for c in loads for label, _ in c}),
        data_loads_per_request=round(per("loads") - (statistics.mean(len(c) for c in loads) if loads else 0.0), 3),
        constructed_per_request=per("constructed"),
        construct_ms_per_request=_mean([_construct_ms(o.evidence) for o in ok]),
        params_built_per_request=per("params_built"),
        module_moves_per_request=per("module_moves"),
        h2d_per_request=per("h2d"),
        d2h_per_request=per("d2h"),
        small_copies_per_request=per("small_copies"),
        unpinned_async_per_request=per("unpinned_async"),
        syncs_per_request=per("syncs"),
        copy_bytes_per_request=per("copy_bytes"),
        forwards=forwards_of(obs),
        errors_sample=sorted({o.error for o in obs if o.error})[:3],
    )
