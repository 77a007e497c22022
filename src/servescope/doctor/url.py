"""``servescope doctor --url``: the checks that work from outside a running endpoint.

The cold first request, the Server-Timing breakdown of sequential requests, and how
throughput scales with concurrent callers. No probes: the causes inside the process are
"not checked" in the report, with the reason (run the doctor on the code to see them).
"""

from __future__ import annotations

import time
from typing import Any

from ..exceptions import ConfigError
from ..report import Report
from ..sections import Diagnosis, Load, Verdict
from .evidence import Cold, Concurrent, Evidence, Warm
from .options import MIN_OK_REQUESTS, MIN_OK_SHARE, DoctorOptions
from .send import BODY_METHODS, Send

__all__ = ["diagnose_url"]

_OUTSIDE = "not visible from outside the process: run `servescope doctor file.py:app` on the code"


def diagnose_url(url: str, *, payload: Any = None, options: DoctorOptions | None = None) -> Report:
    from ..load.bench import BenchOptions, run_bench
    from ..rules import diagnose_report

    options = options or DoctorOptions()
    send = Send.of(payload, files=options.upload())
    method = options.method or ("POST" if send.body else "GET")
    if method == "GET" and send.body:
        raise ConfigError("GET with a body: a GET carries its input in the URL's query string; drop --body")
    if method in BODY_METHODS and not send.body:
        raise ConfigError(f"{method} takes a body: give --body FILE (JSON) or --file FIELD=PATH")
    bodies = [send.body] if send.body else None
    common = dict(method=method, bodies=bodies, content_type=send.content_type, timeout_s=options.timeout_s, warmup_s=0.0)
    started = time.perf_counter()
    [seq] = run_bench(BenchOptions(url=url, concurrency=[1], requests=options.requests, **common))
    seq.meta.update(title=f"servescope doctor --url {url}", tool="servescope doctor", target=url, diagnosed=True)
    sent = (seq.latency.get("count") or 0) + sum(seq.errors.values())
    ok = seq.latency.get("count") or 0
    verdict = Verdict(failures=dict(seq.errors))
    diagnosis = seq.diagnosis = Diagnosis(verdict=verdict)
    seq_load, par_load = seq.load or Load(), Load()
    if ok < max(MIN_OK_REQUESTS, MIN_OK_SHARE * sent):
        verdict.diagnosed = False
        first = seq_load.first_error or next(iter(seq.errors), "no answer")
        verdict.reason = f"{sent - ok} of {sent} requests failed; the first: {first}"
        seq.meta["diagnosed"] = False
        return seq
    [par] = run_bench(BenchOptions(url=url, concurrency=[options.concurrency], requests=options.concurrent_requests, **common))
    par_load = par.load or par_load
    seq_rps, par_rps = seq_load.throughput_rps, par_load.throughput_rps
    par_errors = sum(par.errors.values())
    for kind, n in par.errors.items():
        verdict.failures[kind] = verdict.failures.get(kind, 0) + n
    p50 = seq.latency.get("p50_ms")
    evidence = Evidence(
        target_kind="url",
        cold=Cold(latency_ms=seq.latency.get("first_ms") or 0.0, error=seq_load.first_error),
        warm=Warm(requests=sent, errors=sent - ok, p50_ms=p50),
        concurrent=Concurrent(
            concurrency=options.concurrency,
            requests=(par.latency.get("count") or 0) + par_errors,
            errors=par_errors,
            throughput_rps=par_rps,
            sequential_rps=seq_rps,
            p50_ms=par.latency.get("p50_ms"),
        ),
        seconds=round(time.perf_counter() - started, 2),
        missing={
            "environment": "the server's CPUs and threads are " + _OUTSIDE,
            "batch_probe": "the model is " + _OUTSIDE,
            "concurrent.forwards": "the model's calls are " + _OUTSIDE,
            "concurrent.loop": "the event loop is " + _OUTSIDE,
            "concurrent.cpu": "CPU time and GIL waits are " + _OUTSIDE,
        },
        probes_at_fault="there are no probes from outside the process (--url); run the doctor on the code",
        scaling=round(par_rps / seq_rps, 2) if seq_rps and par_rps else None,
    )
    diagnosis.evidence = evidence.to_dict()
    seq.findings = diagnose_report(seq)
    scale = evidence.scaling
    if scale is not None:
        diagnosis.scaling_note = (
            f"Concurrency scaling: 1 caller {seq_rps:.1f} req/s, {options.concurrency} callers {par_rps:.1f} req/s ({scale:.2f}x)"
            + ("; requests are served one at a time: run the doctor on the code (TARGET) to see why" if scale < 1.3 else "")
        )
    return seq
