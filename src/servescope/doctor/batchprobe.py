"""The batch probe: a captured model call replayed alone, without the probes, at several
batch sizes (and at batch 1 with autograd on and in training mode)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

from .evidence import BatchProbe

__all__ = ["NO_CALL", "batch_probe", "probe_captured"]

NO_CALL = (
    "batch probe skipped: no model call with a batch axis was captured (a torch module, ONNX Runtime "
    "session, scikit-learn estimator or encode() called with an array, tensor or a dict/list of them)"
)


def _best_ms(fn: Callable[[], Any], repeat: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


#: rounds of every size: at most ``ROUNDS``, and past ``MIN_ROUNDS`` no new round starts after
#: ``ROUNDS_S`` (on a busy machine, a model whose batch of 16 takes a second: 20 rounds took 30 s)
ROUNDS, MIN_ROUNDS, ROUNDS_S = 9, 3, 4.0


def _best_each(calls: dict[str, Callable[[], Any]], clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Each call's best time (ms) over rounds that run every call once, in turn: a burst of
    contention on a busy machine (a neighbour taking a core) then slows one round of every
    call, not every repeat of one of them."""
    start = clock()
    for fn in calls.values():
        fn()
    best = dict.fromkeys(calls, float("inf"))
    for done in range(ROUNDS):
        if done >= MIN_ROUNDS and clock() - start > ROUNDS_S:
            break
        for key, fn in calls.items():
            t0 = clock()
            fn()
            best[key] = min(best[key], clock() - t0)
    return {k: v * 1000 for k, v in best.items()}


def _on_fewer_threads(torch: Any, threads: int, work: Callable[[], dict[str, float]]) -> dict[str, float] | None:
    """``work()`` under ``inference_mode`` on a thread of its own whose torch pool has
    ``threads`` threads; None when it fails (the default pass stands alone)."""
    from .experiments.threads import sized_pool

    def run() -> dict[str, float]:
        with torch.inference_mode():
            return work()

    pool, _ = sized_pool(torch, threads, "servescope-batch-probe-fewer")
    try:
        return pool.submit(run).result()
    except Exception:
        return None
    finally:
        pool.shutdown(wait=False)


def batch_probe(
    torch: Any, replay: Callable[[int], Callable[[], Any]], model: Any, sizes: tuple[int, ...], fewer_threads: int | None = None
) -> BatchProbe:
    """Time a captured model call at several batch sizes (``replay(b)`` builds the call with
    the first row replicated ``b`` times), under ``inference_mode`` for torch. For a torch
    module (``model``), also batch 1 with autograd on and in eval mode; its training flags are
    restored, module by module.

    ``fewer_threads`` (a busy machine: the CPUs other processes left free): the sizes are timed
    again on a torch pool of that size, and each size's per-item time is the better of the
    two. Beside a neighbour a batched call, which torch splits across its threads, can stall
    at every OpenMP barrier on the thread that shares a core (15 ms where one row takes 0.6),
    while a lone row runs on one thread: the default pool alone would then say batching never
    pays, when it pays at the thread count the doctor's thread finding names."""
    quiet = torch.inference_mode if torch is not None and model is not None else contextlib.nullcontext
    out = BatchProbe()
    try:
        calls = {str(b): replay(b) for b in sizes}
        with quiet():
            times = _best_each(calls)
        if fewer_threads and torch is not None and model is not None:
            fewer = _on_fewer_threads(torch, fewer_threads, lambda: _best_each(calls))
            if fewer is not None:
                out.per_item_ms_fewer_threads = {k: round(v / int(k), 4) for k, v in fewer.items()}
                out.fewer_threads = fewer_threads
                times = {k: min(v, fewer[k]) for k, v in times.items()}
        out.per_item_ms = {str(b): round(times[str(b)] / b, 4) for b in sizes}
        per_item = out.per_item_ms
        best = min(per_item, key=per_item.__getitem__)
        out.best_batch = int(best)
        out.gain = round(per_item[str(sizes[0])] / per_item[best], 3) if per_item[best] else None
        one = replay(1)
        with quiet():
            out.forward_ms = round(_best_ms(one), 4)
        if model is None:
            return out
        with torch.enable_grad():
            t_grad = _best_ms(one)
        out.grad_ratio = round(t_grad / out.forward_ms, 3) if out.forward_ms else None
        modes = [(m, m.training) for m in model.modules() if hasattr(m, "training")]
        try:
            with torch.inference_mode():
                t_train = _best_ms(one)  # as the endpoint runs it
                model.eval()
                t_eval = _best_ms(one)
        finally:
            for m, flag in modes:
                m.training = flag
        out.train_ratio = round(t_train / t_eval, 3) if t_eval else None
    except Exception as exc:  # the probe is a bonus: its failure is data
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    return out


def probe_captured(
    calls: dict[Any, dict[str, Any]], constant: frozenset[Any], torch: Any, options: Any, fewer: Callable[[], int | None] | None
) -> tuple[BatchProbe | None, str]:
    """The batch probe of one captured call (one whose inputs change with the request, where
    there is one: not one repeated whatever it is asked), on a thread bounded by
    ``options.timeout_s``; ``fewer()``, where given, the threads to time each size on too.
    (the probe, why there is none)."""
    chosen = next((c for fp, c in calls.items() if fp not in constant), None) or next(iter(calls.values()))
    replay, model = chosen["replay"], chosen["model"]
    threads = fewer() if fewer is not None and model is not None else None
    result: list[BatchProbe] = []
    t = threading.Thread(target=lambda: result.append(batch_probe(torch, replay, model, options.batch_probe, threads)), daemon=True,
                         name="servescope-batch-probe")  # fmt: skip
    t.start()
    t.join(options.timeout_s)
    return (result[0], "") if result else (None, f"batch probe abandoned: it did not finish within {options.timeout_s:g} s")
