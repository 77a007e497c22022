"""``servescope doctor``: run the user's endpoint under probes, then name the causes.

    report = diagnose(load_target("app.py:app"), payload={"text": "hi"})

Runs, in order: one cold request; sequential warm requests (the stage breakdown); a
concurrent phase (does it batch? is the event loop blocked? does it scale?); a model-only
probe that replays a captured model input at batch sizes 1..16 (what batching, autograd and
training mode cost). The evidence goes into the Report (``evidence``), and the rules read it
from there, so a saved report can be diagnosed again offline.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .environment import available_cpus
from .recorder import Recorder
from .report import Report
from .rules import diagnose_report
from .sampler import Sampler
from .targets import Observation, make_target, payload_bytes
from .timing import OTHER

__all__ = ["DoctorOptions", "diagnose", "diagnose_url"]

_MODEL_STAGES = ("infer", "to_device", "to_host")


@dataclass
class DoctorOptions:
    path: str = "/predict"
    requests: int = 30
    concurrency: int = 8
    concurrent_requests: int = 48
    timeout_s: float = 30.0
    max_seconds: float = 40.0
    batch_probe: tuple[int, ...] = (1, 2, 4, 8, 16)


def split_other(trace: Any, evidence: dict[str, Any] | None = None) -> dict[str, float]:
    """A trace's stages, with its unstaged time split: before the first model or transfer
    call (after validation) is ``preprocess``; after the last one, until serialization, is
    ``postprocess``. The rest stays ``other`` (framework and network). Model construction
    seen by the probes (first to last ``nn.Module.__init__``) counts as ``load``."""
    durations = dict(trace.durations_ms)
    spans = [s for s in trace.spans() if s[3] == 0]
    first_init = (evidence or {}).get("first_init_ns")
    if first_init is not None and trace.started_ns is not None:
        lo = (first_init - trace.started_ns) / 1e6
        hi = (evidence["last_init_ns"] - trace.started_ns) / 1e6
        covered = sum(max(0.0, min(s[2], hi) - max(s[1], lo)) for s in spans)
        built = min(max(0.0, hi - lo - covered), durations.get(OTHER, 0.0))
        if built > 0:
            durations["load"] = durations.get("load", 0.0) + built
            durations[OTHER] -= built
            spans.append(("load", lo, hi, 0))
    bounds = _model_bounds(trace, spans, evidence)
    if bounds is None or durations.get(OTHER, 0.0) <= 0:
        return durations
    begin, first, last, end = bounds

    def gap(lo: float, hi: float) -> float:
        covered = sum(max(0.0, min(s[2], hi) - max(s[1], lo)) for s in spans)
        return max(0.0, (hi - lo) - covered)

    pre, post = gap(begin, first), gap(last, end)
    pre = min(pre, durations[OTHER])
    post = min(post, durations[OTHER] - pre)
    if pre > 0:
        durations["preprocess"] = durations.get("preprocess", 0.0) + pre
    if post > 0:
        durations["postprocess"] = durations.get("postprocess", 0.0) + post
    rest = durations[OTHER] - pre - post
    if rest > 1e-6:
        durations[OTHER] = rest
    else:
        durations.pop(OTHER)
    return durations


def _model_bounds(
    trace: Any, spans: list[tuple[str, float, float, int]], evidence: dict[str, Any] | None
) -> tuple[float, float, float, float] | None:
    """(begin, first, last, end) in ms since the trace began: preprocessing runs from the end of
    validation (or the handler's real start) to the first model/transfer call, postprocessing
    from the last one to serialization. None when the request never called the model."""
    model = [s for s in spans if s[0] in _MODEL_STAGES]
    if not model:
        return None
    first, last = min(s[1] for s in model), max(s[2] for s in model)
    begin = max((s[2] for s in spans if s[2] <= first and s[0] in ("validate", "receive")), default=0.0)
    entered = (evidence or {}).get("handler_start_ns")
    if entered is not None and trace.started_ns is not None:  # not the framework's thread hop
        begin = max(begin, min((entered - trace.started_ns) / 1e6, first))
    end = min((s[1] for s in spans if s[1] >= last and s[0] in ("serialize", "send")), default=trace.total_ms)
    return begin, first, last, end


def stage_windows(trace: Any, evidence: dict[str, Any] | None = None) -> dict[str, list[tuple[int, int]]]:
    """Absolute (perf_counter ns) windows of a trace's pre/post/serialize time, for sampling."""
    base = trace.started_ns
    if base is None:
        return {}
    spans = [s for s in trace.spans() if s[3] == 0]
    out: dict[str, list[tuple[int, int]]] = {"serialize": [], "preprocess": [], "postprocess": []}
    for name, lo, hi, _ in spans:
        if name in out:
            out[name].append((base + int(lo * 1e6), base + int(hi * 1e6)))
    bounds = _model_bounds(trace, spans, evidence)
    if bounds is not None:
        begin, first, last, end = bounds
        out["preprocess"].append((base + int(begin * 1e6), base + int(first * 1e6)))
        out["postprocess"].append((base + int(last * 1e6), base + int(end * 1e6)))
    return out


def _forward_stats(obs: list[Observation]) -> dict[str, Any]:
    forwards = [f for o in obs for f in o.evidence.get("forwards", [])]
    per_request = [len(o.evidence.get("forwards", [])) for o in obs if o.error is None]
    return {
        "count": len(forwards),
        "per_request": round(statistics.mean(per_request), 2) if per_request else 0,
        "batch_sizes": sorted({f["batch"] for f in forwards if f.get("batch") is not None}),
        "max_batch": max((f["batch"] or 0 for f in forwards), default=0),
        "training": sum(1 for f in forwards if f["training"]),
        "training_changes_output": sum(1 for f in forwards if f["training_changes_output"]),
        "grad": sum(1 for f in forwards if f["grad"]),
        "on_event_loop": sum(1 for f in forwards if f["on_event_loop"]),
        "param_devices": sorted({f["param_device"] for f in forwards if f.get("param_device")}),
        "input_devices": sorted({f["input_device"] for f in forwards if f.get("input_device")}),
        "mean_ms": round(statistics.mean(f["ms"] for f in forwards if "ms" in f), 4) if any("ms" in f for f in forwards) else None,
        "modules": sorted({f["module"] for f in forwards}),
    }


def _per_request(obs: list[Observation], key: str) -> float:
    ok = [o for o in obs if o.error is None]
    return round(statistics.mean(o.evidence.get(key, 0) for o in ok), 3) if ok else 0.0


def _batch_probe(probes: Any, sizes: tuple[int, ...]) -> dict[str, Any] | None:
    """Time the captured model on its captured input at several batch sizes."""
    torch = probes.torch
    model, x = probes.captured.get("model"), probes.captured.get("input")
    if torch is None or model is None or x is None:
        return None
    probes.remove()  # time the model alone, without the probes' hooks

    def rows(b: int) -> Any:
        if isinstance(x, dict):
            return {k: (torch.cat([v[:1]] * b) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
        return torch.cat([x[:1]] * b)

    one = rows(1)
    out: dict[str, Any] = {"per_item_ms": {}}

    def best(fn: Callable[[], Any], repeat: int = 9) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1000

    try:
        with torch.inference_mode():
            for b in sizes:
                xb = rows(b)
                out["per_item_ms"][str(b)] = round(best(lambda: model(xb)) / b, 4)
        per_item = out["per_item_ms"]
        base = per_item[str(sizes[0])]
        best_b = min(per_item, key=per_item.get)
        out["best_batch"] = int(best_b)
        out["gain"] = round(base / per_item[best_b], 3) if per_item[best_b] else None
        with torch.inference_mode():
            t_inf = best(lambda: model(one))
        with torch.enable_grad():
            t_grad = best(lambda: model(one))
        out["grad_ratio"] = round(t_grad / t_inf, 3) if t_inf else None
        modes = [(m, m.training) for m in model.modules()]  # the user's state, module by module
        try:
            with torch.inference_mode():
                t_train = best(lambda: model(one))  # as the endpoint runs it
                model.eval()
                t_eval = best(lambda: model(one))
        finally:
            for m, flag in modes:
                m.training = flag
        out["train_ratio"] = round(t_train / t_eval, 3) if t_eval else None
        out["forward_ms"] = round(t_inf, 4)
    except Exception as exc:  # the probe is a bonus: its failure is data
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def diagnose(
    obj: Any,
    *,
    payload: Any,
    options: DoctorOptions | None = None,
    progress: Callable[[str, float], None] | None = None,
    target_name: str = "",
) -> Report:
    """Run the endpoint under probes and return the Report with its findings."""
    from .probes import Probes

    options = options or DoctorOptions()
    tick = progress or (lambda phase, frac: None)
    target = make_target(obj, path=options.path, timeout_s=options.timeout_s)
    body = payload_bytes(payload)
    rec = Recorder()
    started = time.perf_counter()
    probes = Probes()
    probes.install()
    torch = probes.torch
    try:
        target.start()
        tick("cold request", 0.0)
        cold = target.request(payload, body)
        warm: list[Observation] = []
        with Sampler() as sampler:
            for i in range(options.requests):
                if time.perf_counter() - started > options.max_seconds * 0.5:
                    break
                warm.append(target.request(payload, body))
                tick("sequential requests", (i + 1) / options.requests)
        tick("concurrent requests", 0.0)
        seq_rps = None
        ok_warm = [o for o in warm if o.error is None]
        if ok_warm:
            seq_rps = 1000 / statistics.mean(o.latency_ms for o in ok_warm)
        budget = max(options.max_seconds - (time.perf_counter() - started), 1.0) * 0.6
        conc, elapsed = target.concurrent(payload, body, options.concurrency, options.concurrent_requests, budget)
        tick("batch probe", 0.0)
        lag = list(target.lag_ms)
        probe = _batch_probe(probes, options.batch_probe)
    finally:
        probes.remove()
        target.stop()

    conc = [o for o in conc if o.error != "unfinished at the end"]  # cut off by the time budget
    for o in warm:  # the cold request is reported on its own (first_ms), not in the statistics
        stages = split_other(o.trace, o.evidence) if o.trace is not None else {}
        if o.trace is not None and target.kind != "function":  # what the server did not see
            stages["network+client"] = max(o.latency_ms - (o.trace.total_ms or 0.0), 0.0)
        rec.record_durations(stages, o.latency_ms, error=o.error)
    conc_ok = [o for o in conc if o.error is None]
    warm_p50 = float(np.percentile([o.latency_ms for o in ok_warm], 50)) if ok_warm else None
    evidence: dict[str, Any] = {
        "target_kind": target.kind,
        "cold": {
            "latency_ms": round(cold.latency_ms, 3),
            "error": cold.error,
            "loads": cold.evidence.get("loads", 0),
            "constructed": cold.evidence.get("constructed", 0),
            "load_calls": cold.evidence.get("load_calls", []),
        },
        "warm": {
            "requests": len(warm),
            "errors": sum(1 for o in warm if o.error),
            "p50_ms": round(warm_p50, 4) if warm_p50 is not None else None,
            "loads_per_request": _per_request(warm, "loads"),
            "load_ms_per_request": round(
                statistics.mean(sum(ms for _, ms in o.evidence.get("load_calls", [])) for o in ok_warm), 4
            )
            if ok_warm
            else 0.0,
            "load_calls": sorted({label for o in ok_warm for label, _ in o.evidence.get("load_calls", [])}),
            "constructed_per_request": _per_request(warm, "constructed"),
            "construct_ms_per_request": round(
                statistics.mean(
                    ((o.evidence["last_init_ns"] - o.evidence["first_init_ns"]) / 1e6) if o.evidence.get("first_init_ns") else 0.0
                    for o in ok_warm
                ),
                4,
            )
            if ok_warm
            else 0.0,
            "module_moves_per_request": _per_request(warm, "module_moves"),
            "h2d_per_request": _per_request(warm, "h2d"),
            "d2h_per_request": _per_request(warm, "d2h"),
            "small_copies_per_request": _per_request(warm, "small_copies"),
            "unpinned_async_per_request": _per_request(warm, "unpinned_async"),
            "syncs_per_request": _per_request(warm, "syncs"),
            "copy_bytes_per_request": _per_request(warm, "copy_bytes"),
            "forwards": _forward_stats(warm),
            "errors_sample": sorted({o.error for o in warm if o.error})[:3],
        },
        "concurrent": {
            "concurrency": options.concurrency,
            "requests": len(conc),
            "errors": sum(1 for o in conc if o.error),
            "throughput_rps": round(len(conc_ok) / elapsed, 2) if elapsed else None,
            "sequential_rps": round(seq_rps, 2) if seq_rps else None,
            "p50_ms": round(float(np.percentile([o.latency_ms for o in conc_ok], 50)), 3) if conc_ok else None,
            "forwards": _forward_stats(conc),
            "loop_lag_max_ms": round(max(lag), 3) if lag else None,
            "loop_lag_p99_ms": round(float(np.percentile(lag, 99)), 3) if lag else None,
        },
        "batch_probe": probe,
        "environment": {
            "cuda_available": bool(torch is not None and torch.cuda.is_available()),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "cpus_available": available_cpus(),
            "workers": 1,
        },
        "seconds": round(time.perf_counter() - started, 2),
    }
    report = rec.report(title=f"servescope doctor {target_name}".strip(), tool="servescope doctor", target=target_name, diagnosed=True)
    report.latency["first_ms"] = round(cold.latency_ms, 4)
    windows: dict[str, list[tuple[int, int]]] = {}
    for o in ok_warm:
        if o.trace is not None:
            for k, v in stage_windows(o.trace, o.evidence).items():
                windows.setdefault(k, []).extend(v)
    evidence["hot_spots"] = sampler.hot_spots(windows)
    report.extra["evidence"] = evidence
    failures = sorted({o.error for o in [cold, *warm, *conc] if o.error})
    if failures:
        report.extra["endpoint_errors"] = failures[:5]
    report.findings = diagnose_report(report)
    return report


def diagnose_url(url: str, *, payload: Any, options: DoctorOptions | None = None) -> Report:
    """The checks that work from outside, on an endpoint that is already running: the cold
    first request, the Server-Timing breakdown of sequential requests, and how throughput
    scales with concurrent callers. No probes: causes inside the process need a TARGET."""
    from .bench import BenchOptions, run_bench

    options = options or DoctorOptions()
    common = dict(method="POST", bodies=[payload_bytes(payload)], content_type="application/json", timeout_s=options.timeout_s, warmup_s=0.0)
    started = time.perf_counter()
    [seq] = run_bench(BenchOptions(url=url, concurrency=[1], requests=options.requests, **common))
    [par] = run_bench(BenchOptions(url=url, concurrency=[options.concurrency], requests=options.concurrent_requests, **common))
    seq_rps, par_rps = seq.extra.get("throughput_rps"), par.extra.get("throughput_rps")
    p50 = seq.latency.get("p50_ms")
    zero = {"loads_per_request": 0, "constructed_per_request": 0}
    seq.extra["evidence"] = {
        "target_kind": "url",
        "cold": {"latency_ms": seq.latency.get("first_ms") or 0.0, "error": seq.extra.get("first_error"), "loads": 0, "constructed": 0, "load_calls": []},
        "warm": {"requests": seq.latency.get("count"), "p50_ms": p50, **zero},
        "concurrent": {"concurrency": options.concurrency, "throughput_rps": par_rps, "sequential_rps": seq_rps, "p50_ms": par.latency.get("p50_ms")},
        "scaling": round(par_rps / seq_rps, 2) if seq_rps and par_rps else None,
        "seconds": round(time.perf_counter() - started, 2),
    }
    seq.meta.update(title=f"servescope doctor --url {url}", tool="servescope doctor", target=url, diagnosed=True)
    seq.findings = diagnose_report(seq)
    scale = seq.extra["evidence"]["scaling"]
    if scale is not None:
        seq.extra["scaling_note"] = (
            f"Concurrency scaling: 1 caller {seq_rps:.1f} req/s, {options.concurrency} callers {par_rps:.1f} req/s ({scale:.2f}x)"
            + ("; requests are served one at a time: run the doctor on the code (TARGET) to see why" if scale < 1.3 else "")
        )
    return seq
