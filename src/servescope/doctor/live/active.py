"""``doctor --pid --url``: the doctor's own requests to the live server while it is sampled.

Sequential requests, one at a time with a pause after each (so the samples tell each request
apart), each timed by the client; then concurrent ones through bench's load generator."""

from __future__ import annotations

import http.client
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...exceptions import ConfigError
from ..options import DoctorOptions
from ..send import BODY_METHODS, Send
from .requests import Samples

__all__ = ["Concurrent", "Sequential", "concurrent_phase", "sequential_phase"]


@dataclass
class Sequential:
    latencies: list[float] = field(default_factory=list)  # ms, the requests that succeeded
    windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) perf_counter s, the same requests
    errors: list[str] = field(default_factory=list)
    paced: bool = False  # sent apart, so the samples tell each request from the next

    @property
    def rps(self) -> float | None:
        return round(1000 / statistics.median(self.latencies), 2) if self.latencies else None

    def errors_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.errors:
            kind = e.split(":", 1)[0]
            out[kind] = out.get(kind, 0) + 1
        return out

    def match(self, samples: Samples) -> list[tuple[dict[str, float], float]]:
        """Each request the samples told apart, with the client's latency for it: requests and
        sampled groups line up by their start relative to the first of each (the two clocks
        differ by py-spy's start-up), to within half the pause between requests."""
        if not self.windows or not samples.bounds:
            return []
        if len(samples.bounds) == len(self.windows):
            return list(zip(samples.requests, self.latencies))
        w0, b0 = self.windows[0][0], samples.bounds[0][0]
        out, used = [], set()
        for stages, (t0, _) in zip(samples.requests, samples.bounds):
            rel = (t0 - b0) / 1e6
            best = min(range(len(self.windows)), key=lambda i: abs(self.windows[i][0] - w0 - rel))
            if best not in used and abs(self.windows[best][0] - w0 - rel) <= 0.02 + (self.windows[best][1] - self.windows[best][0]):
                used.add(best)
                out.append((stages, self.latencies[best]))
        return out


@dataclass
class Concurrent:
    requests: int = 0
    errors: int = 0
    rps: float | None = None
    p50_ms: float | None = None


def _send(url: str, payload: Any, options: DoctorOptions) -> tuple[str, str, bytes, dict[str, str]]:
    send = Send.of(payload, files=options.upload())
    method = options.method or ("POST" if send.body else "GET")
    if method in BODY_METHODS and not send.body:
        raise ConfigError(f"{method} takes a body: give --body FILE (JSON) or --file FIELD=PATH")
    headers = {"Content-Type": send.content_type} if send.content_type else {}
    return method, url, send.body, headers


def sequential_phase(
    url: str, payload: Any, options: DoctorOptions, *, requests: int, pace_s: float = 0.0, busy_s: float = 0.0, budget_s: float | None = None
) -> Sequential:
    """``requests`` requests one at a time, ``pace_s`` apart, and more until they have
    kept the server busy ``busy_s`` (enough samples for a fast endpoint's stages), within
    ``budget_s`` (default: half of ``options.max_seconds``)."""
    method, url, body, headers = _send(url, payload, options)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url must be an http:// or https:// URL, got {url!r}")
    conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    out = Sequential()
    conn = conn_type(parts.hostname, parts.port, timeout=options.timeout_s)
    deadline = time.perf_counter() + (options.max_seconds * 0.5 if budget_s is None else budget_s)
    i = 0
    try:
        while i < requests or sum(out.latencies) < busy_s * 1000:
            if i >= 3 and time.perf_counter() > deadline:
                break
            i += 1
            t0 = time.perf_counter()
            try:
                conn.request(method, path, body=body or None, headers=headers)
                resp = conn.getresponse()
                resp.read()
                t1 = time.perf_counter()
                if resp.status >= 400:
                    out.errors.append(f"HTTP {resp.status}: {resp.reason}")
                else:
                    out.latencies.append((t1 - t0) * 1000)
                    out.windows.append((t0, t1))
            except (OSError, http.client.HTTPException) as exc:
                out.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                conn.close()
                conn = conn_type(parts.hostname, parts.port, timeout=options.timeout_s)
            if pace_s:
                time.sleep(pace_s)
    finally:
        conn.close()
    return out


def concurrent_phase(url: str, payload: Any, options: DoctorOptions) -> Concurrent:
    from ...load.bench import BenchOptions, run_bench

    method, url, body, headers = _send(url, payload, options)
    [rep] = run_bench(
        BenchOptions(url=url, method=method, bodies=[body] if body else [], content_type=headers.get("Content-Type"),
                     concurrency=[options.concurrency], requests=options.concurrent_requests, timeout_s=options.timeout_s, warmup_s=0.0)
    )  # fmt: skip
    load = rep.load
    errors = sum(rep.errors.values())
    return Concurrent(
        requests=(rep.latency.get("count") or 0) + errors,
        errors=errors,
        rps=load.throughput_rps if load is not None else None,
        p50_ms=rep.latency.get("p50_ms"),
    )
