"""What the sampled stacks say about the requests: time by stage, requests told apart by the
idle gaps between them, the event loop's busy runs, the model's loads and calls, hot lines.

A sample every 10 ms (py-spy's default rate) times a request only to that resolution: stage
times are sums of spans, right on average over many requests, coarse for one short request.
Requests are told apart by gaps in which no thread of the server worked on one; the doctor's
own sequential requests leave such a gap on purpose (``doctor --pid --url``). Real traffic
may not: back-to-back requests count as one, which ``Samples.requests_exact`` says."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .stages import in_request, is_library, load_label, package, stage_of
from .trace import Frame, Span, Thread

__all__ = ["Samples", "analyse", "is_loop_thread"]

#: Stages a run of the model's call counts as one call of (a load per request: one load)
_COUNTED = ("infer", "load")
#: Spans further apart than this (a sample missed) do not continue one another
_GAP_US = 2_000


@dataclass
class Samples:
    """The analysis of one recording (or one phase of it)."""

    seconds: float = 0.0
    #: time in requests by stage, every thread and process summed, ms
    stage_ms: dict[str, float] = field(default_factory=dict)
    #: each request told apart: its stages in ms, and its start and end (us)
    requests: list[dict[str, float]] = field(default_factory=list)
    bounds: list[tuple[int, int]] = field(default_factory=list)
    #: runs of the model's calls and of loads (one run = one call, at this resolution)
    calls: dict[str, int] = field(default_factory=dict)
    load_calls: list[str] = field(default_factory=list)
    #: the share of the run's tenths in which a load was sampled: a load on every request shows
    #: all through the run; a lazy one-off, in one place (calls shorter than a sample interval
    #: cannot be counted, only seen to recur)
    load_spread: float = 0.0
    #: the event loop's thread(s): time sampled, time in requests, the longest such run
    loop_ms: float = 0.0
    loop_busy_ms: float = 0.0
    loop_longest_ms: float = 0.0
    loop_infer_calls: int = 0
    loop_hot_spot: str = ""
    #: time in requests per process (its threads summed), ms; and where the threads that are
    #: not an event loop's spent their time in requests
    request_ms_by_pid: dict[int, float] = field(default_factory=dict)
    worker_hot_spot: str = ""
    #: the share of the run during which some thread worked on a request: near 1, requests
    #: came back to back (or overlapped) and cannot be told apart
    busy_fraction: float = 0.0
    hot_spots: dict[str, str] = field(default_factory=dict)
    #: stage -> its most sampled lines (the innermost of the user's code), with their ms
    top_lines: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    hot_in_user_code: dict[str, bool] = field(default_factory=dict)


def is_loop_thread(th: Thread) -> bool:
    """A thread that runs an asyncio (or uvloop) event loop: its stacks pass through the loop."""
    return any(
        (package(f.file) == "asyncio" and ("run_forever" in f.name or "Runner.run" in f.name)) or package(f.file) == "uvloop"
        for s in th.spans[:50] + th.spans[-50:]
        for f in s.frames
    )


def _hot(frames: tuple[Frame, ...]) -> tuple[str, bool]:
    """The innermost frame of the user's code (the line to look at), else the innermost frame."""
    for f in reversed(frames):
        if not is_library(f.file):
            return f.where(), True
    return (frames[-1].where(), False) if frames else ("", False)


#: Stages whose time is native code that runs without the GIL (a thread in them works even
#: when it does not hold the GIL); in the others, a thread without the GIL waits for it
_NATIVE = ("infer", "load", "to_device", "to_host", "preprocess")


def _held(gil: list[Thread] | None) -> dict[tuple[int, int], list[tuple[int, int]]] | None:
    if gil is None:
        return None
    return {(t.pid, t.tid): [(s.t0_us, s.t1_us) for s in t.spans] for t in gil}


def _overlap(t0: int, t1: int, spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(t1, b) - max(t0, a)) for a, b in spans if a < t1 and b > t0)


def analyse(threads: list[Thread], join_us: int = 15_000, gil: list[Thread] | None = None) -> Samples:
    """The recording's threads, analysed (``join_us``: spans closer than this are one request).
    ``gil``: the same threads recorded holding the GIL (py-spy --gil), on the same clock: an
    event loop's thread in Python code without the GIL is waiting for it, not working."""
    held = _held(gil)
    out = Samples()
    if not threads:
        return out
    t_min = min(t.spans[0].t0_us for t in threads)
    t_max = max(t.spans[-1].t1_us for t in threads)
    out.seconds = round((t_max - t_min) / 1e6, 3)
    work: list[tuple[Span, str, bool]] = []  # (span, stage, on the loop)
    hot: dict[str, Counter[tuple[str, bool]]] = defaultdict(Counter)
    loads: Counter[str] = Counter()
    workers_hot: Counter[str] = Counter()
    for th in threads:
        loop = is_loop_thread(th)
        loop_hot: Counter[str] = Counter()
        prev_stage, prev_end = "", -1
        busy_from = busy_to = -(10**15)  # (no busy run yet)
        for s in th.spans:
            busy = in_request(s.frames)
            stage = stage_of(s.frames) if busy else ""
            joined = 0 <= s.t0_us - prev_end <= _GAP_US
            # a stage held without a break is one call of it (consecutive calls the sampler
            # saw no gap between count once: the counts are lower bounds)
            if stage in _COUNTED and not (joined and stage == prev_stage):
                _count(out, stage, loop, s.frames, loads)
            prev_stage, prev_end = stage, s.t1_us
            where = _hot(s.frames) if busy else ("", False)
            if busy:
                work.append((s, stage, loop))
                out.request_ms_by_pid[th.pid] = out.request_ms_by_pid.get(th.pid, 0.0) + s.ms
                if not loop:
                    workers_hot[where[0]] += s.t1_us - s.t0_us
                out.stage_ms[stage] = out.stage_ms.get(stage, 0.0) + s.ms
                hot[stage][where] += s.t1_us - s.t0_us
            if not loop:
                continue
            out.loop_ms += s.ms
            working = s.t1_us - s.t0_us
            if busy and held is not None and stage not in _NATIVE:  # (Python code: working only while it holds the GIL)
                working = _overlap(s.t0_us, s.t1_us, held.get((th.pid, th.tid), []))
            if busy and working * 2 >= s.t1_us - s.t0_us:  # the loop ran the request's code instead of waking other tasks
                out.loop_busy_ms += working / 1000
                loop_hot[where[0]] += s.t1_us - s.t0_us
                busy_from = busy_from if 0 <= s.t0_us - busy_to <= _GAP_US else s.t0_us
                busy_to = s.t1_us
                out.loop_longest_ms = max(out.loop_longest_ms, (busy_to - busy_from) / 1000)
        if loop_hot:
            out.loop_hot_spot = loop_hot.most_common(1)[0][0]
    out.load_calls = [name for name, _ in loads.most_common()]
    out.worker_hot_spot = workers_hot.most_common(1)[0][0] if workers_hot else ""
    tenths = {min(9, (s.t0_us - t_min) * 10 // max(t_max - t_min, 1)) for s, stage, _ in work if stage == "load"}
    out.load_spread = len(tenths) / 10
    for stage, c in hot.items():
        (where, user), _ = c.most_common(1)[0]
        out.hot_spots[stage], out.hot_in_user_code[stage] = where, user
        out.top_lines[stage] = [(w, round(us / 1000, 3)) for (w, _), us in c.most_common(5)]
    _requests(out, work, join_us)
    out.busy_fraction = round(sum(t1 - t0 for t0, t1 in out.bounds) / max(t_max - t_min, 1), 3)
    out.stage_ms = {k: round(v, 3) for k, v in out.stage_ms.items()}
    out.loop_ms, out.loop_busy_ms, out.loop_longest_ms = round(out.loop_ms, 3), round(out.loop_busy_ms, 3), round(out.loop_longest_ms, 3)
    return out


def _count(out: Samples, stage: str, loop: bool, frames: tuple[Frame, ...], loads: Counter[str]) -> None:
    out.calls[stage] = out.calls.get(stage, 0) + 1
    if stage == "infer" and loop:
        out.loop_infer_calls += 1
    if stage == "load":
        loads[load_label(frames)] += 1


def _requests(out: Samples, work: list[tuple[Span, str, bool]], join_us: int) -> None:
    """Requests told apart by gaps of ``join_us`` with no thread in one; the user's code that no
    rule names is preprocessing before the request's first model call and postprocessing after
    its last (other where there is no call, or between two)."""
    work.sort(key=lambda w: w[0].t0_us)
    groups: list[list[tuple[Span, str, bool]]] = []
    end = None
    for w in work:
        if end is None or w[0].t0_us - end > join_us:
            groups.append([])
        groups[-1].append(w)
        end = max(end or 0, w[0].t1_us)
    for g in groups:
        infer = [s.t0_us for s, stage, _ in g if stage == "infer"]
        first, last = (min(infer), max(infer)) if infer else (None, None)
        stages: dict[str, float] = {}
        for s, stage, _ in g:
            if stage == "other" and first is not None and last is not None:
                stage = "preprocess" if s.t1_us <= first else "postprocess" if s.t0_us > last else "other"
            stages[stage] = stages.get(stage, 0.0) + s.ms
        out.requests.append({k: round(v, 3) for k, v in stages.items()})
        out.bounds.append((g[0][0].t0_us, max(s.t1_us for s, _, _ in g)))
