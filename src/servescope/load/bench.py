"""``servescope bench``: load an endpoint, and report latency per stage from its Server-Timing.

    options = BenchOptions(url="http://127.0.0.1:8000/predict", method="POST",
                           bodies=[b'{"text": "hi"}'], concurrency=[1, 4, 16], duration_s=10)
    reports = run_bench(options)          # one Report per load level

Each level runs warm-up then measurement as one continuous load (no gap for the server to
recover), and the very first request of the whole run is sent alone first: its latency is the
cold start (``latency.first_ms``). What a level's raw results mean (``results_report``) is
``results.py``.
"""

from __future__ import annotations

import asyncio
import math
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..exceptions import ConfigError, EndpointError
from .inputs import send_order
from .loadgen import LoadGenerator
from .openai_api import asked_tokens
from .phases import http_phases
from .sessions import SessionGenerator, SessionPlan, session_stats
from ..report import Report
from ..sections import GeneratorHealth
from .results import (  # what a level's results mean, importable from here as before
    AFTER_HEAD,
    BACKLOG_AGE,
    BACKLOG_REQUESTS,
    CLIENT_WAIT,
    NETWORK,
    PROXY,
    completion_rate,
    results_report,
    warmup_backlog,
)
from .slo import SLO
from .sampler import Sampler
from .sweep import saturation, sweep_summary  # the sweep's analysis, importable from here as before
from .trace import Trace
from .wire import Result, URL, build_requests, error_kind

__all__ = ["BenchOptions", "failed_levels", "parse_duration", "run_bench", "results_report", "saturation", "sweep_summary"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """``"10s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a plain number of seconds -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"not a duration: {text!r} (use 10s, 500ms, 2m)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    return value


@dataclass
class BenchOptions:
    """What to send, how hard, for how long. Validated at construction."""

    url: str
    method: str = "GET"
    bodies: list[bytes] = field(default_factory=list)
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    concurrency: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    poisson: bool = False
    duration_s: float | None = 10.0
    requests: int | None = None
    warmup_s: float = 1.0
    timeout_s: float = 30.0
    max_connections: int = 1024
    seed: int | None = None
    #: objectives to judge each level on (``SLO.parse("p99<200ms")``): goodput, and met or not
    slo: SLO | None = None
    #: how the bodies are sent: "cycle" (in order, again and again) or "random" (each pass
    #: over them shuffled, seeded by ``seed``)
    order: str = "cycle"
    #: an OpenAI-compatible endpoint, "chat" or "completions" (bodies from ``openai_api.request_bodies``):
    #: its output tokens are counted (``load.tokens``)
    openai: str | None = None
    model: str | None = None
    #: each body's input size, for ``load.by_size`` (default: its length in bytes), and the unit
    sizes: list[int] | None = None
    size_unit: str = "bytes"
    #: how the requests were made, for the report's meta (``bench --input-tokens``: the token
    #: counts asked and who counted them)
    workload: dict[str, Any] | None = None
    #: replay this trace's arrival times (``trace.read_trace``), sped up ``trace_speedup`` times;
    #: ``bodies`` then hold one request per trace line (``--openai``) or are sent in turn
    trace: Trace | None = None
    trace_speedup: float = 1.0
    #: ``--turns``: conversations instead of single requests (``sessions.SessionPlan``); each
    #: level's concurrency is conversations under way, its rate conversations started a second
    sessions: SessionPlan | None = None
    #: ``--scrape``: the server's Prometheus metrics URL, sampled every ``scrape_interval_s``
    #: over each level's measured window (``load.server_metrics``); ``gpu``: this machine's GPUs
    #: too, when nvidia-ml-py sees any (``load.gpu``)
    scrape: str | None = None
    scrape_interval_s: float = 1.0
    gpu: bool = True

    def __post_init__(self) -> None:
        self.target = URL.parse(self.url)
        self.method = self.method.upper()
        if not re.fullmatch(r"[A-Z]+", self.method):
            raise ConfigError(f"not an HTTP method: {self.method!r}")
        if self.concurrency and self.rate:
            raise ConfigError("give --concurrency (closed loop) or --rate (open loop), not both")
        if self.trace is not None:
            if self.concurrency or self.rate or self.poisson:
                raise ConfigError("a trace sets when each request is sent: --trace takes no --concurrency, --rate or --poisson")
            if self.order != "cycle":
                raise ConfigError("a trace sends its requests in its own order: --trace takes no --order random")
            if not self.trace_speedup > 0 or math.isinf(self.trace_speedup):
                raise ConfigError(f"the trace's speed-up must be a number > 0, got {self.trace_speedup!r}")
        elif not self.concurrency and not self.rate:
            self.concurrency = [1]
        for c in self.concurrency:
            if not isinstance(c, int) or c < 1:
                raise ConfigError(f"concurrency must be a whole number >= 1, got {c!r}")
        for r in self.rate:
            if not isinstance(r, (int, float)) or not r > 0 or math.isinf(r):
                raise ConfigError(f"rate must be a number of requests/s > 0, got {r!r}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration must be > 0, got {self.duration_s!r}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"requests must be >= 1, got {self.requests!r}")
        if self.requests is not None:
            self.duration_s = None
        if self.warmup_s < 0 or self.timeout_s <= 0:
            raise ConfigError("warm-up must be >= 0 and timeout > 0")
        if self.bodies and self.method == "GET":
            self.method = "POST"
        if self.openai not in (None, "chat", "completions"):
            raise ConfigError(f"openai must be 'chat' or 'completions', got {self.openai!r}")
        if self.sizes is not None and len(self.sizes) != len(self.bodies):
            raise ConfigError(f"sizes must give one size per body: {len(self.sizes)} for {len(self.bodies)} bodies")
        #: which body each request of the list the generator cycles is (one list for every generator)
        self.send_order = send_order(len(self.bodies) or 1, self.order, seed=self.seed)
        Sampler(scrape=self.scrape, interval_s=self.scrape_interval_s, gpu=False)  # the URL, the interval, prometheus-client

    @property
    def levels(self) -> list[tuple[str, float]]:
        if self.trace is not None:
            return [("trace", self.trace_speedup)]
        return [("concurrency", c) for c in self.concurrency] + [("rate", r) for r in self.rate]

    def raw_requests(self) -> list[bytes]:
        """The requests the generator cycles, in ``order``."""
        raw = build_requests(
            self.target, method=self.method, bodies=self.bodies or None, headers=self.headers,
            content_type=self.content_type,
        )  # fmt: skip
        return raw if self.order == "cycle" else [raw[i] for i in self.send_order]

    def report_options(self) -> dict[str, Any]:
        """What ``results_report`` needs to know of the requests: the API, and each one's input size."""
        sizes = self.sizes if self.sizes is not None else [len(b) for b in self.bodies]
        asked = asked_tokens(self.bodies) if self.openai else None
        return {
            "openai": self.openai, "model": self.model, "size_unit": self.size_unit,
            "sizes": [sizes[i] for i in self.send_order] if sizes else None,
            "asked_tokens": [asked[i] for i in self.send_order] if asked else None,
        }  # fmt: skip



async def first_request(options: BenchOptions, raw: list[bytes]) -> tuple[float | None, str | None]:
    gen = LoadGenerator(options.target, raw[:1], timeout_s=options.timeout_s, openai=options.openai is not None)
    results = await gen.closed_loop(concurrency=1, requests=1)
    if not results:
        return None, "no response"
    r = results[0]
    return (r.done_ns - r.sent_ns) / 1e6, error_kind(r)


async def run_level(
    options: BenchOptions,
    raw: list[bytes],
    mode: str,
    level: float,
    on_tick: Callable[[LoadGenerator], None] | None,
    state: dict[str, Any],
    *,
    offset_ns: int = 0,
    seed: int | None = None,
) -> tuple[list[Result], int, int | None, list[int]]:
    if options.sessions is not None:
        return await run_sessions(options, mode, level, on_tick, state)
    gen = LoadGenerator(
        options.target, raw, timeout_s=options.timeout_s, max_connections=options.max_connections, on_tick=on_tick,
        openai=options.openai is not None,
    )
    state["gen"] = gen
    t0 = time.perf_counter_ns()
    measure_from = t0 + round(options.warmup_s * 1e9)
    duration = None if options.duration_s is None else options.warmup_s + options.duration_s
    total_requests = None
    if options.requests is not None:  # requests count the measured ones: add the warm-up's
        total_requests = options.requests + (round(options.warmup_s * level) if mode == "rate" else 0)
    if options.requests is not None and mode == "concurrency":
        measure_from = t0  # a request budget in closed loop: no time-based warm-up
    window_opens(options, state, measure_from)
    if mode == "concurrency":
        await gen.closed_loop(concurrency=int(level), duration_s=duration, requests=total_requests)
    elif mode == "trace":
        assert options.trace is not None
        await gen.open_loop(offsets_ns=options.trace.offsets_ns(level), duration_s=duration, requests=options.requests)
    else:
        await gen.open_loop(
            rate=level, duration_s=duration, requests=total_requests, poisson=options.poisson,
            seed=options.seed if seed is None else seed, offset_ns=offset_ns,
        )  # fmt: skip
    return level_end(options, gen, state, measure_from)


def window_opens(options: BenchOptions, state: dict[str, Any], measure_from: int) -> None:
    """Tell ``state["on_window"]`` (``run_bench``'s sampler, if any) when the level's measured
    window opens and when it is due to end (None: at the last request, ``--requests``)."""
    on_window = state.get("on_window")
    if on_window is not None:
        on_window(measure_from, None if options.duration_s is None else measure_from + round(options.duration_s * 1e9))


def level_end(options: BenchOptions, gen: LoadGenerator, state: dict[str, Any], measure_from: int) -> tuple[list[Result], int, int | None, list[int]]:
    """A level's results, its measured window and the generator's lags; ``state`` keeps the
    generator (``done``) for what the report reads of it."""
    state["gen"] = None
    state["done"] = gen
    state["first_error_body"] = gen.first_error_body
    until = None if options.duration_s is None else measure_from + round(options.duration_s * 1e9)
    if until is not None:  # interrupted: the window ends where the run was stopped, not after its drain
        until = min(until, gen.stopped_ns or time.perf_counter_ns())
    return gen.results, measure_from, until, gen.lags


async def run_sessions(
    options: BenchOptions, mode: str, level: float, on_tick: Callable[[LoadGenerator], None] | None, state: dict[str, Any]
) -> tuple[list[Result], int, int | None, list[int]]:
    """A level of conversations: ``level`` under way (closed loop) or started a second (open)."""
    assert options.sessions is not None
    gen = SessionGenerator(options.target, options.sessions, timeout_s=options.timeout_s, max_connections=options.max_connections, on_tick=on_tick)
    state["gen"] = gen
    measure_from = time.perf_counter_ns() + round(options.warmup_s * 1e9)
    window_opens(options, state, measure_from)
    duration = None if options.duration_s is None else options.warmup_s + options.duration_s
    if mode == "concurrency":
        await gen.closed_sessions(concurrency=int(level), duration_s=duration, sessions=options.requests)
    else:
        await gen.open_sessions(rate=level, duration_s=duration, sessions=options.requests, poisson=options.poisson, seed=options.seed)
    return level_end(options, gen, state, measure_from)


def level_meta(options: BenchOptions, mode: str, level: float) -> dict[str, Any]:
    """What a level's report says of how it was run."""
    if mode == "trace":
        trace = options.trace
        assert trace is not None
        return {
            "tool": "servescope bench", "target": str(options.target), "method": options.method,
            "mode": "open loop, trace replay", "speedup": level,
            "trace": {"path": trace.path, "requests": len(trace), "span_s": round(trace.span_s / level, 3)},
            "duration_s": options.duration_s, "warmup_s": options.warmup_s,
            **({"workload": options.workload} if options.workload else {}),
            "title": f"servescope bench {options.method} {options.target} (trace {trace.path}, x{level:g})",
        }  # fmt: skip
    return {
        "tool": "servescope bench",
        "target": str(options.target),
        "method": options.method,
        "mode": "closed loop" if mode == "concurrency" else ("open loop, Poisson" if options.poisson else "open loop"),
        mode: level,
        "duration_s": options.duration_s,
        "warmup_s": options.warmup_s,
        **({"workload": options.workload} if options.workload else {}),
        **({"sessions": {"turns": options.sessions.turns, "think_ms": options.sessions.think_ns / 1e6}} if options.sessions else {}),
        "title": f"servescope bench {options.method} {options.target} ({mode}={level:g}"
        + (f" conversations of {options.sessions.turns} turns)" if options.sessions else ")"),
    }


def is_unreachable(error: str | None) -> bool:
    """True for a first request that could not even connect (a wrong URL, a server not up)."""
    return error in ("connection refused", "connect timeout") or (error or "").startswith("connect error")


def run_bench(
    options: BenchOptions,
    *,
    on_tick: Callable[[str, LoadGenerator], None] | None = None,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    on_results: Callable[[str, float, list[Result], int], None] | None = None,
) -> list[Report]:
    """Run every load level; return one Report per level (the cold first request in each).

    ``on_results(mode, level, results, measure_from_ns)`` gets each level's raw results as it
    ends (``request_log.RequestLog.add`` writes the measured ones as CSV rows).

    Raises ``EndpointError`` when the very first request cannot connect (a wrong URL or a server
    that is not up), ``ConfigError`` when ``options.scrape`` cannot be read (before any request:
    ``load/sampler.py`` samples it, and the GPUs, over each measured window). Ctrl-C (SIGINT) ends the level under way: its report covers what ran,
    and later levels are skipped.
    """
    raw = options.raw_requests()
    reports: list[Report] = []
    state: dict[str, Any] = {"gen": None, "interrupted": False}
    sampler = Sampler(scrape=options.scrape, interval_s=options.scrape_interval_s, gpu=options.gpu)
    sampler.open()  # a --scrape URL that cannot be read is a ConfigError here, before any request
    if sampler.active:
        state["on_window"] = sampler.start  # each level's measured window (``window_opens``)

    def interrupt() -> None:
        state["interrupted"] = True
        sampler.end()  # the window's last scrape now, where the report's window ends
        if state["gen"] is not None:
            state["gen"].stop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, interrupt)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
            pass
        first_ms, first_err = await first_request(options, raw)
        if is_unreachable(first_err):
            raise EndpointError(f"cannot reach {options.target}: {first_err}")
        for mode, level in options.levels:
            if state["interrupted"]:
                break
            label = f"{mode}={level:g}"
            tick = (lambda gen, label=label: on_tick(label, gen)) if on_tick else None
            cpu0 = time.process_time()
            results, measure_from, until, lags = await run_level(options, raw, mode, level, tick, state)
            cpu = time.process_time() - cpu0
            server_metrics, gpu = sampler.stop()
            if on_results is not None:
                on_results(mode, level, results, measure_from)
            meta = level_meta(options, mode, level)
            if state["interrupted"]:
                meta["interrupted"] = True
            gen = state["done"]
            sizes = {"sizes": gen.sizes, "asked_tokens": gen.asked} if options.sessions is not None else {}
            rep = results_report(
                results, measure_from_ns=measure_from, measure_until_ns=until, first_ms=first_ms,
                lags_ns=lags, meta=meta, open_loop=mode != "concurrency", slo=options.slo, **(options.report_options() | sizes),
            )  # fmt: skip
            assert rep.load is not None  # results_report made it
            rep.load.first_error = first_err or None
            rep.load.first_error_body = state.get("first_error_body")
            rep.load.server_metrics, rep.load.gpu = server_metrics, gpu
            if gpu is None and sampler.gpu_note:
                rep.meta["gpu"] = sampler.gpu_note
            measured = [r for r in results if r.scheduled_ns >= measure_from]
            rep.load.http = http_phases(measured, dns_ns=gen.dns_ns, connects=gen.connects)
            if options.sessions is not None:
                rep.load.sessions = session_stats(measured, gen)
            if results:
                rep.load.generator = rep.load.generator or GeneratorHealth()
                rep.load.generator.cpu_us_per_request = round(cpu / len(results) * 1e6, 1)
            reports.append(rep)

    loop = (loop_factory or fast_loop())()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        sampler.close()
    return reports


#: A level at or over this share of failed requests did not measure the endpoint: its latency
#: figures are of error answers (often fast ones), so the run fails and says so first.
FAILED_SHARE = 0.5


def failed_levels(reports: list[Report]) -> str | None:
    """What to say first when a level's requests mostly failed (or none completed), else None:
    the failures by kind and the first error answer's body."""
    said = []
    for rep in reports:
        load = rep.load
        measured = load.requests.measured if load is not None and load.requests is not None else 0
        failed = sum(rep.errors.values())
        if measured and failed < FAILED_SHARE * measured:
            continue
        kinds = ", ".join(f"{kind} x{n}" for kind, n in sorted(rep.errors.items(), key=lambda kv: -kv[1])) or "no answer"
        level = next((f"{k}={rep.meta[k]:g}" for k in ("concurrency", "rate") if isinstance(rep.meta.get(k), (int, float))), "the run")
        said.append(f"{level}: {failed} of {measured} requests failed ({kinds})" if measured else f"{level}: no request completed")
    if not said:
        return None
    body = next((r.load.first_error_body for r in reports if r.load is not None and r.load.first_error_body), None)
    return "; ".join(said) + (f". First error answer: {body}" if body else "")


def fast_loop() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard] on Linux/macOS
        return asyncio.new_event_loop
