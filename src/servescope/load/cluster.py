"""Ray: connecting to a cluster, and ``servescope bench`` with its load from many machines.

    reports = run_bench_ray(options, address="auto", generators=4)

Each generator is a Ray actor (spread over the cluster's nodes, one CPU each) running the
same load loop as a local bench on its share of the load: closed loop splits the connections,
open loop splits the rate and interleaves the schedules (generator ``i`` of ``K`` at ``R/K``
requests/s, offset by ``i/R``: together exactly ``R`` evenly spaced; Poisson streams get their
own seeds, and Poisson streams add up to a Poisson stream). All start together on a
wall-clock barrier; their raw results come back and are merged before any percentile is
taken, so the merged percentiles are exact, never an average of percentiles.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any, Callable

from .bench import (
    BenchOptions,
    fast_loop,
    first_request,
    is_unreachable,
    level_meta,
    run_level,
)
from ..exceptions import ConfigError, EndpointError, require
from ..report import Report
from .results import results_report
from ..sections import GeneratorRow, Load
from .wire import Result

__all__ = ["connect", "run_bench_ray", "split_level"]

#: Logical CPUs a local Ray instance advertises, so replicas and generators (one CPU each)
#: fit on a small machine; on a real cluster each takes a real CPU.
LOCAL_CPUS = 8
#: How far ahead the generators' common start is set, for the slowest to be ready.
BARRIER_S = 1.0


def connect(address: str | None = None) -> bool:
    """Connect this process to Ray; returns True when it started a local instance itself.

    ``address``: None or ``"local"`` (start one here), ``"auto"`` (the cluster this machine is
    part of), ``HOST:PORT`` (a head node's GCS) or ``ray://HOST:PORT`` (Ray Client). An address
    that does not answer is reported at once (Ray itself would retry for minutes).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = require("ray", "ray", "to run on Ray")
    if ray.is_initialized():  # type: ignore[attr-defined]
        return False
    quiet = {"log_to_driver": False, "logging_level": "warning", "include_dashboard": False}
    if address in (None, "", "local"):
        ray.init(num_cpus=max(LOCAL_CPUS, os.cpu_count() or 1), **quiet)  # type: ignore[attr-defined]
        return True
    if address != "auto":
        host, port = _host_port(address)
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError as exc:
            raise EndpointError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None
    try:
        ray.init(address=address, **quiet)  # type: ignore[attr-defined]
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EndpointError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
    return False


def node_name() -> str:
    """This process's machine and Ray node: ``host/node-id-prefix`` (several Ray nodes can share
    one host in tests and on big machines)."""
    host = socket.gethostname()
    try:
        import ray

        return f"{host}/{ray.get_runtime_context().get_node_id()[:8]}"
    except Exception:  # not in a Ray worker
        return host


def _host_port(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"malformed Ray address {address!r}: expected HOST:PORT, ray://HOST:PORT, auto or local")
    return host.strip("[]"), int(port)


def split_level(mode: str, level: float, generators: int) -> list[tuple[float, int]]:
    """Each generator's share of a load level: (its concurrency or rate, its schedule offset ns).

    Closed loop: the connections dealt out (fewer generators than ``generators`` when there
    are fewer connections). Open loop: ``level / K`` each, generator ``i`` offset by ``i / level``
    seconds, so the merged schedule is the single-generator one.
    """
    if generators < 1:
        raise ConfigError(f"generators must be >= 1, got {generators!r}")
    if mode == "concurrency":
        c = int(level)
        return [(c // generators + (i < c % generators), 0) for i in range(min(generators, c))]
    return [(level / generators, round(i * 1e9 / level)) for i in range(generators)]


def _share(total: int | None, index: int, parts: int) -> int | None:
    return None if total is None else total // parts + (index < total % parts)


class LoadGeneratorActor:
    """One generator (a Ray actor with two threads: one runs the load, one can stop it)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"gen": None}
        self.loop: Any = None
        self.seen = 0  # results already reported by progress()

    def where(self) -> str:
        return node_name()

    def first(self, options: BenchOptions) -> tuple[float | None, str | None]:
        loop = fast_loop()()
        try:
            return loop.run_until_complete(first_request(options, options.raw_requests()))
        finally:
            loop.close()

    def run(self, options: BenchOptions, mode: str, level: float, offset_ns: int, seed: int | None, start_at: float) -> dict[str, Any]:
        """Run one share of a level from the wall-clock time ``start_at``; results come back
        with times relative to the start of measurement (each machine has its own clock)."""
        raw = options.raw_requests()
        self.seen = 0
        self.loop = loop = fast_loop()()
        try:
            delay = start_at - time.time()
            if delay > 0:
                time.sleep(delay)
            late_ms = max(0.0, (time.time() - start_at) * 1e3)
            cpu0 = time.process_time()
            results, measure_from, until, lags = loop.run_until_complete(
                run_level(options, raw, mode, level, None, self.state, offset_ns=offset_ns, seed=seed)
            )
            cpu = time.process_time() - cpu0
        finally:
            self.loop = None
            loop.close()
        m = measure_from
        shifted = [
            r._replace(
                scheduled_ns=r.scheduled_ns - m, sent_ns=r.sent_ns - m, done_ns=r.done_ns - m,
                # a streamed response's head and chunk times move with the rest (#16: TTFT, ITL)
                stream=None if r.stream is None else (r.stream[0], r.stream[1] - m, [t - m for t in r.stream[2]]),
            )
            for r in results
        ]  # fmt: skip
        return {
            "results": shifted,
            "until": None if until is None else until - measure_from,
            "lags": lags,
            "cpu_s": cpu,
            "node": node_name(),
            "start_late_ms": round(late_ms, 3),
        }

    def progress(self) -> tuple[int, int, list[float]]:
        """Requests done in the run under way, and since the last call: errors and the
        successes' latencies (ms), for the live line."""
        gen = self.state.get("gen")
        if gen is None:
            return self.seen, 0, []
        n, errors, ok = gen.progress_since(self.seen)
        self.seen = n
        return n, errors, ok

    def stop(self) -> None:
        gen, loop = self.state.get("gen"), self.loop
        if gen is not None and loop is not None:
            loop.call_soon_threadsafe(gen.stop)


def run_bench_ray(
    options: BenchOptions,
    *,
    address: str | None = None,
    generators: int = 2,
    say: Callable[[str], None] | None = None,
    on_progress: Callable[[str, int, int, list[float]], None] | None = None,
    on_results: Callable[[str, float, list[Result], int], None] | None = None,
) -> list[Report]:
    """``run_bench`` with the load coming from ``generators`` Ray actors; one merged Report per level.

    A generator lost mid-run (its node died) is named in ``report.load.generators_lost``; the
    report keeps what the others measured. Ctrl-C stops every generator and keeps what ran.
    ``on_progress(label, requests, new_errors, new_ok_latencies_ms)`` is called about twice a
    second with every generator's progress merged (``BenchProgress.show`` draws it);
    ``on_results`` gets each level's results, every generator's together, as ``run_bench``'s.
    """
    if not isinstance(generators, int) or generators < 1:
        raise ConfigError(f"generators must be a whole number >= 1, got {generators!r}")
    if options.scrape is not None:
        raise ConfigError("--scrape is not supported with --ray: bench from one machine to sample the server's metrics beside its load")
    started = connect(address)
    import ray

    say = say or (lambda _: None)
    actor_cls = ray.remote(num_cpus=1, max_concurrency=3)(LoadGeneratorActor)  # run, progress, stop
    actors = [actor_cls.options(scheduling_strategy="SPREAD").remote() for _ in range(generators)]
    reports: list[Report] = []
    try:
        nodes = ray.get([a.where.remote() for a in actors], timeout=300)
        say(f"{generators} load generator(s) on {len(set(nodes))} node(s): {', '.join(sorted(set(nodes)))}")
        first_ms, first_err = ray.get(actors[0].first.remote(options), timeout=options.timeout_s + 60)
        if is_unreachable(first_err):
            raise EndpointError(f"cannot reach {options.target} from the Ray cluster: {first_err}")
        for mode, level in options.levels:
            shares = split_level(mode, level, generators)
            start_at = time.time() + BARRIER_S
            refs = []
            for i, (share, offset) in enumerate(shares):
                part = dataclasses.replace(options, requests=_share(options.requests, i, len(shares)))
                seed = None if options.seed is None else options.seed + i
                refs.append(actors[i].run.remote(part, mode, share, offset, seed, start_at))
            poll = None if on_progress is None else (lambda n, e, ok, label=f"{mode}={level:g}": on_progress(label, n, e, ok))
            outcomes, interrupted = _gather(ray, refs, [actors[i] for i in range(len(shares))], poll)
            rep = _merge(options, mode, level, outcomes, first_ms)
            if on_results is not None:  # shifted so that each generator's measured window starts at 0
                on_results(mode, level, [r for o in outcomes if not isinstance(o, str) for r in o["results"]], 0)
            if first_err and rep.load is not None:
                rep.load.first_error = first_err
            if interrupted:
                rep.meta["interrupted"] = True
            reports.append(rep)
            if interrupted:
                break
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
    return reports


def _gather(
    ray: Any, refs: list[Any], actors: list[Any], poll: Callable[[int, int, list[float]], None] | None = None
) -> tuple[list[dict[str, Any] | str], bool]:
    """Every generator's outcome (a dict, or why it was lost); Ctrl-C stops them all first.
    While they run, ``poll`` gets their merged progress about twice a second."""
    interrupted = False
    while True:
        try:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            if len(done) == len(refs):
                break
            if poll is not None:
                _poll(ray, actors, poll)
        except KeyboardInterrupt:
            interrupted = True
            for a in actors:
                a.stop.remote()
            poll = None
    outcomes: list[dict[str, Any] | str] = []
    for i, ref in enumerate(refs):
        try:
            outcomes.append(ray.get(ref))
        except Exception as exc:  # a dead actor or node: keep the others
            outcomes.append(f"generator {i}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return outcomes, interrupted


def _poll(ray: Any, actors: list[Any], poll: Callable[[int, int, list[float]], None]) -> None:
    try:
        parts = ray.get([a.progress.remote() for a in actors], timeout=5)
    except Exception:  # a generator lost or slow: the live line waits, the run goes on
        return
    poll(sum(p[0] for p in parts), sum(p[1] for p in parts), [ms for p in parts for ms in p[2]])


def _merge(options: BenchOptions, mode: str, level: float, outcomes: list[dict[str, Any] | str], first_ms: float | None) -> Report:
    """One report from every generator's raw results (exact percentiles over the union)."""
    results: list[Result] = []
    lags: list[int] = []
    untils: list[int] = []
    rows = []
    lost = [o for o in outcomes if isinstance(o, str)]
    for i, out in enumerate(outcomes):
        if isinstance(out, str):
            continue
        results.extend(out["results"])
        lags.extend(out["lags"])
        if out["until"] is not None:
            untils.append(out["until"])
        n = len(out["results"])
        rows.append(
            GeneratorRow(
                generator=i,
                node=out["node"],
                requests=n,
                cpu_us_per_request=round(out["cpu_s"] / n * 1e6, 1) if n else None,
                start_late_ms=out["start_late_ms"],
            )
        )
    if not rows:
        raise EndpointError("every load generator was lost, so nothing was measured: " + "; ".join(lost))
    meta = {**level_meta(options, mode, level), "generators": len(outcomes)}
    rep = results_report(
        results, measure_from_ns=0, measure_until_ns=min(untils) if untils else None, first_ms=first_ms,
        lags_ns=lags, meta=meta, open_loop=mode == "rate", slo=options.slo, **options.report_options(),
    )  # fmt: skip
    load = rep.load = rep.load or Load()
    load.generators = rows
    load.generators_lost = lost
    return rep
