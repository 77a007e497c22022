"""What a load level's raw results mean: ``results_report`` turns a generator's ``Result``s
into one Report (latency per stage from each response's Server-Timing, throughput, and the
``load`` section: streams, tokens, SLOs, the timeline, a warm-up's backlog).

    report = results_report(gen.results, measure_from_ns=measure_from, open_loop=True)

``bench.py`` runs the levels and calls it (and re-exports what is here).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..exceptions import ServerTimingError
from .inputs import size_buckets
from .openai_api import token_stats
from ..recorder import Recorder
from ..report import Report
from ..sections import GeneratorHealth, Load, Requests, ServerTimingCounts, Slo, WarmupBacklog
from ..servertiming import server_timing_durations
from .slo import SLO, judge
from ..stats import Distribution, summarize
from .streams import Streamed, stream_stats
from .timeline import timeline
from ..timing import OTHER
from .wire import OVERSIZED, Result, error_kind, streamed

__all__ = ["AFTER_HEAD", "CLIENT_WAIT", "NETWORK", "PROXY", "completion_rate", "results_report", "warmup_backlog"]

#: The stage that holds what the server's own timing does not: the network, the client,
#: and the server outside its stages before they started (accept, parsing).
NETWORK = "network+client"
#: The same gap when the server says a proxy stands before it (``upstream`` in its
#: Server-Timing, as servescope's replicas on Ray Serve do): the proxy's parsing, routing and
#: queueing, plus the network and the client.
PROXY = "proxy+network"
_REPLICA = re.compile(rb'replica;\s*desc="?([^",;]+)')
#: A streamed response: from its head to its last byte (the server's Server-Timing, sent with
#: the head, covers the time before it: the rest of the stream is this stage).
AFTER_HEAD = "stream_after_head"
#: Open loop only: time a request waited for its send slot (a free connection, or a late
#: scheduler); part of the latency a user would see.
CLIENT_WAIT = "client_wait"


#: a warm-up queue is said when this many requests wait at the window's opening, the oldest for
#: this many times what the warm-up's first requests took (an empty queue's latency)
BACKLOG_REQUESTS, BACKLOG_AGE = 4, 4.0


def warmup_backlog(results: list[Result], measure_from_ns: int) -> WarmupBacklog | None:
    """Requests due in the warm-up still unanswered when the measured window opened, when
    there are ``BACKLOG_REQUESTS`` of them and the oldest had waited ``BACKLOG_AGE`` times the
    latency of the warm-up's first requests (a server over capacity at this rate: that queue is
    in the window's latencies); None when the warm-up left no such queue."""
    warm = sorted((r for r in results if r.scheduled_ns < measure_from_ns), key=lambda r: r.scheduled_ns)
    waiting = [r.scheduled_ns for r in warm if r.done_ns > measure_from_ns]
    if len(waiting) < BACKLOG_REQUESTS:
        return None
    early = warm[: max(5, len(warm) // 10)]
    empty_queue_ms = float(np.median([(r.done_ns - r.scheduled_ns) / 1e6 for r in early]))
    oldest_ms = (measure_from_ns - min(waiting)) / 1e6
    return WarmupBacklog(requests=len(waiting), oldest_ms=round(oldest_ms, 1)) if oldest_ms >= BACKLOG_AGE * empty_queue_ms else None


def results_report(
    results: list[Result],
    *,
    measure_from_ns: int,
    measure_until_ns: int | None = None,
    first_ms: float | None = None,
    lags_ns: list[int] | None = None,
    meta: dict[str, Any] | None = None,
    open_loop: bool = False,
    slo: SLO | None = None,
    openai: str | None = None,
    model: str | None = None,
    sizes: list[int] | None = None,
    size_unit: str = "bytes",
    asked_tokens: list[int | None] | None = None,
) -> Report:
    """A Report from raw results: requests *scheduled* from ``measure_from_ns`` on count.

    Latency counts from the earlier of the scheduled and the actual send time (coordinated
    omission corrected: equal to the send time in closed loop); ``uncorrected`` from the send.
    Stages come from each response's Server-Timing; ``network+client`` is what the client saw
    beyond the server's total. Plain 6-tuples in ``Result``'s field order (the form before
    ``Result`` had names) are read as Results. Streamed responses add ``load.stream`` (TTFB,
    TTFT, the gaps between tokens: ``streams.stream_stats``; ``open_loop`` corrects the gaps
    for coordinated omission); an ``slo`` adds ``load.slo`` (each objective judged on the run,
    and the goodput: requests whose own figures met every objective). ``openai`` (the API)
    adds ``load.tokens`` (output tokens, vLLM's TPOT; with ``asked_tokens``, each request's
    ``max_tokens``, the answers that stopped short of it); ``sizes`` (each request's input size, by
    ``Result.request``) adds ``load.by_size`` when the sizes differ.
    """
    results = [r if type(r) is Result else Result(*r) for r in results]
    rec = Recorder(keep_samples=0)
    uncorrected = Distribution()
    measured = [r for r in results if r.scheduled_ns >= measure_from_ns]
    with_timing = 0
    bad_timing = 0
    too_large = 0
    replicas: dict[str, int] = {}
    streams: list[Streamed] = []
    oks: list[tuple[float, int]] = []  # each success's latency, and its index in streams (-1: not streamed)
    for result in measured:
        sched, sent, done, st = result.scheduled_ns, result.sent_ns, result.done_ns, result.server_timing
        start = sched if sched < sent else sent
        latency = (done - start) / 1e6
        kind = error_kind(result)
        if kind is not None:
            rec.record_durations({}, latency, error=kind)
            if st is not None:  # an error answer with the header: the server does send it
                with_timing += 1
            continue
        from_send = (done - sent) / 1e6
        uncorrected.add(from_send)
        head_ns = None
        if streamed(result):
            streams.append(Streamed(start, *result.stream))
            head_ns = result.stream[1]
            oks.append((latency, len(streams) - 1))
        elif slo is not None:
            oks.append((latency, -1))
        stages: dict[str, float] = {}
        if st is not None:
            try:  # each response's own: a bad one is counted and set aside, the run goes on
                if st == OVERSIZED:
                    too_large += 1
                    raise ServerTimingError("over the size kept per response")
                stages, total = server_timing_durations(st.decode("latin-1"))
            except ServerTimingError:
                bad_timing += 1
                stages, total = {}, None
            if stages or total is not None:
                with_timing += 1
                covered = sum(stages.values())
                if total is not None and total > covered:  # server time outside its stages
                    stages[OTHER] = stages.get(OTHER, 0.0) + total - covered
                server = total if total is not None else covered
                if head_ns is None:
                    stages[PROXY if b"upstream;" in st else NETWORK] = max(from_send - server, 0.0)
                else:  # a streamed answer's head says the server's time up to the head
                    stages[PROXY if b"upstream;" in st else NETWORK] = max((head_ns - sent) / 1e6 - server, 0.0)
                    stages[AFTER_HEAD] = max((done - head_ns) / 1e6, 0.0)
                m = _REPLICA.search(st)
                if m:
                    replica = m.group(1).decode("latin-1")
                    replicas[replica] = replicas.get(replica, 0) + 1
        wait = (sent - sched) / 1e6
        if wait > 0 and stages:
            stages[CLIENT_WAIT] = wait
        rec.record_durations(stages, latency)
    report = rec.report(**(meta or {}))
    if first_ms is not None:
        report.latency["first_ms"] = round(first_ms, 4)
    ok = report.latency["count"]
    throughput, window_s = completion_rate(results, measured, ok, measure_from_ns, measure_until_ns, closed=not open_loop)
    end = measure_until_ns or max((r.done_ns for r in measured), default=measure_from_ns)
    load = report.load = Load(
        throughput_rps=round(throughput, 2) if measured else 0.0,
        requests=Requests(measured=len(measured), ok=ok, warmup=len(results) - len(measured)),
        uncorrected=summarize(uncorrected),
        server_timing=ServerTimingCounts(
            responses_with_header=with_timing,
            malformed=bad_timing,
            too_large=too_large,
            hint=None
            if with_timing or not any(r.status for r in measured)  # no answer at all: nothing to judge the header by
            else f"every Server-Timing header the server sent was malformed or too large ({bad_timing} set aside), so only "
            "end-to-end figures are shown"
            if bad_timing
            else "the server sent no Server-Timing header, so only end-to-end figures are shown: add "
            "servescope.middleware.ServescopeMiddleware (or serve with servescope.serve) to get the per-stage breakdown",
        ),
        replicas=dict(sorted(replicas.items())),  # who answered, from each response's Server-Timing
        timeline=timeline(measured, start_ns=measure_from_ns, end_ns=end),  # latency over time: a stall shows
        warmup_backlog=warmup_backlog(results, measure_from_ns) if open_loop else None,
    )
    gaps: list[np.ndarray] = []
    if streams:
        load.stream, gaps = stream_stats(streams, open_loop=open_loop, window_s=window_s)
    if slo is not None:
        good = 0
        for latency, i in oks:
            if i < 0:
                good += slo.request_met(latency_ms=latency)
                continue
            s = streams[i]
            n = len(s.times_ns)
            good += slo.request_met(
                latency_ms=latency,
                ttfb_ms=(s.head_ns - s.start_ns) / 1e6,
                ttft_ms=(s.times_ns[0] - s.start_ns) / 1e6 if n else None,
                gaps_ms=gaps[i],
                tpot_ms=(s.times_ns[-1] - s.times_ns[0]) / 1e6 / (n - 1) if n > 1 else None,
            )
        checks = judge(slo, report)
        load.slo = Slo(
            slo=str(slo), met=all(c.met for c in checks), checks=checks, good=good,
            goodput_rps=round(good / window_s, 2) if measured else 0.0,
        )  # fmt: skip
    if openai is not None:
        load.tokens = token_stats(measured, api=openai, model=model, window_s=window_s, asked=asked_tokens)
    if sizes:
        load.by_size = size_buckets(measured, sizes, unit=size_unit)
    if lags_ns:
        lags = np.asarray(lags_ns, dtype=float) / 1e6
        p99 = float(np.percentile(lags, 99))
        load.generator = GeneratorHealth(
            schedule_lag_p50_ms=round(float(np.percentile(lags, 50)), 3),
            schedule_lag_p99_ms=round(p99, 3),
            behind=bool(p99 > 2.0),
        )
    return report


def completion_rate(
    results: list[Result], measured: list[Result], ok: int, measure_from_ns: int, measure_until_ns: int | None,
    *, closed: bool = False,
) -> tuple[float, float]:
    """Throughput, and the window the measured requests' other rates are taken over.

    Throughput is the rate at which the server completed successes during the measured window:
    those that ended in it (warm-up requests included), over its length. Counting instead the
    requests *due* in the window repeats the offered rate back above the server's capacity (an
    open loop at 40/s on a server that completes 21.5/s read 40/s), and dividing them by the
    time to the last one's end reads low whenever responses are long (streams). The measured
    requests' goodput and tokens are stated at the same rate: over ``ok / throughput`` seconds.
    Without an end to the window (``--requests``) it ends at the last measured success.

    In closed loop (``closed``) each success counts by the share of its time that fell in the
    window (a 525 ms answer half in it counts a half): whole completions in a window cut the
    answers at its two edges, up to one answer's length of error (4% over 12 s of 525 ms
    answers, and more without a warm-up, where the window opens with nothing under way for a
    whole answer's time); shares add up to exactly the requests' worth of work the server did
    in the window, at any concurrency. In open loop a server over capacity keeps a growing
    queue, which shares would count as work done, so there it is whole completions."""
    done_ok = [r.done_ns for r in measured if error_kind(r) is None]
    end = measure_until_ns or max(done_ok, default=measure_from_ns)
    span_s = max((end - measure_from_ns) / 1e9, 1e-9)
    if closed:
        work = 0.0
        for r in results:
            if error_kind(r) is None:
                start = r.scheduled_ns if r.scheduled_ns < r.sent_ns else r.sent_ns
                if r.done_ns > start:
                    inside = min(r.done_ns, end) - max(start, measure_from_ns)
                    if inside > 0:
                        work += inside / (r.done_ns - start)
        if work > 0 and ok:
            rate = work / span_s
            return rate, ok / rate
    completed = sum(1 for r in results if measure_from_ns <= r.done_ns <= end and error_kind(r) is None)
    if not completed or not ok:  # nothing ended in the window (responses longer than it): to the last end
        last = max(done_ok, default=end)
        span_s = max((last - measure_from_ns) / 1e9, 1e-9)
        return ok / span_s, span_s
    rate = completed / span_s
    return rate, ok / rate
