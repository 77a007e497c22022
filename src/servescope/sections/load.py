"""The sections ``servescope bench`` writes: ``Load`` (the report's ``load``) and the parts it
holds (requests, streamed answers, tokens, SLOs, the timeline, conversations, time on the wire)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..stats import Distribution, summarize
from .base import Notes, Section, Summary

__all__ = [
    "BURST_MS", "GeneratorHealth", "GeneratorRow", "Http", "Load", "Requests", "ServerTimingCounts", "Sessions",
    "SizeBucket", "Slo", "SloCheck", "Stream", "Timeline", "Tokens", "TurnRow", "WarmupBacklog", "Window",
]  # fmt: skip


@dataclass(kw_only=True)
class Requests(Section):
    """Requests sent in the measured window, those that succeeded, and those of the warm-up."""

    measured: int = 0
    ok: int = 0
    warmup: int = 0


@dataclass(kw_only=True)
class ServerTimingCounts(Section):
    """How many responses carried a Server-Timing header, and how many of those were set aside."""

    responses_with_header: int = 0
    #: unreadable, a duration over one day, or over the size kept (``too_large`` counted here too)
    malformed: int = 0
    too_large: int = 0
    #: what to do when the server sent none (null when some did)
    hint: str | None = None


@dataclass(kw_only=True)
class GeneratorHealth(Section):
    """Whether the load generator kept its schedule (open loop), and what it cost."""

    schedule_lag_p50_ms: float | None = None
    schedule_lag_p99_ms: float | None = None
    behind: bool | None = None
    cpu_us_per_request: float | None = None


@dataclass(kw_only=True)
class GeneratorRow(Section):
    """One Ray load generator of ``bench --ray``."""

    generator: int
    node: str
    requests: int = 0
    cpu_us_per_request: float | None = None
    start_late_ms: float | None = None


#: Gaps under this (ms) are tokens read together, in a burst: no cadence, no rate per request.
BURST_MS = 0.1


def merged_distributions(parts: list[Any], where: str) -> dict[str, Distribution]:
    """Each distribution (by name) of the parts' ``distributions``, merged across them."""
    dists: dict[str, Distribution] = {}
    for p in parts:
        for name, data in p.distributions.items():
            d = Distribution.from_dict(data, where=f"{where}.distributions.{name}")
            dists[name] = dists[name].merge(d) if name in dists else d
    return dists


@dataclass(kw_only=True)
class Stream(Section):
    """Streamed responses among the successes (chunked, or Server-Sent Events): docs/bench.md
    defines each figure. ``distributions`` (name -> a distribution's JSON form) is what the
    figures come from and what ``Report.combine`` merges: figures are recomputed from the
    merged distributions, counts summed; ``chunks_per_s`` (over each run's own window) and
    ``itl_expected_ms`` (each run's own) are left out, with a note."""

    #: "chunked", "sse", or "chunked+sse"
    kind: str = "chunked"
    #: streamed responses, and the tokens (chunks, or SSE events with data) they carried
    responses: int = 0
    chunks: int = 0
    #: from the request's start (open loop: the earlier of scheduled and sent) to the head
    ttfb: Summary | None = None
    #: from the request's start to the first token
    ttft: Summary | None = None
    #: gaps between consecutive tokens as observed, each once, all requests' together (vLLM's ITL)
    itl: Summary | None = None
    #: open loop: the gaps with the waits of the tokens overdue during a long one added
    #: (HdrHistogram's and wrk2's correction), beside the headline
    itl_corrected: Summary | None = None
    #: reports written before 2026-12-04, whose ``itl`` was the corrected one: the observed gaps
    itl_uncorrected: Summary | None = None
    #: per request: (last token - first token) / (tokens - 1)
    tpot: Summary | None = None
    #: the median request's tokens per second after its first (1000 / tpot p50); null when
    #: its tokens came in a burst (tpot p50 under ``BURST_MS``)
    chunks_per_s_per_request: float | None = None
    #: every token of the measured window, per second of it
    chunks_per_s: float | None = None
    #: open loop: the interval the ITL correction expects tokens at (the median gap)
    itl_expected_ms: float | None = None
    distributions: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_distributions(cls, dists: dict[str, Distribution], **kwargs: Any) -> Stream:
        """The figures of these distributions (``ttfb``, ``ttft``, ``itl``, ``tpot``, and
        ``itl_corrected`` in open loop), which the section keeps."""
        out = cls(**kwargs, distributions={name: d.to_dict() for name, d in dists.items()})
        for name, d in dists.items():
            setattr(out, name, summarize(d))
        p50 = (out.tpot or {}).get("p50_ms")
        # tokens read together (a server that sends them all at once) have no per-request rate
        out.chunks_per_s_per_request = round(1000 / p50, 2) if p50 and p50 >= BURST_MS else None
        return out

    def distribution(self, name: str) -> Distribution | None:
        """One of the kept distributions (``ttft``, ``itl`` ...), or None."""
        data = self.distributions.get(name)
        return None if data is None else Distribution.from_dict(data, where=f"load.stream.distributions.{name}")

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Stream | None:
        have: list[Stream] = [p for p in parts if p is not None]
        if not have:
            return None
        dists = merged_distributions(have, "load.stream")
        for name, why in (
            ("chunks_per_s", "each run's rate is over its own window, which may or may not overlap the others'"),
            ("itl_expected_ms", "each run corrected its gaps with its own expected interval"),
        ):
            if any(getattr(p, name) is not None for p in have):
                notes[f"load.stream.{name}"] = why
        kinds = sorted({k for p in have for k in p.kind.split("+")})
        return cls.from_distributions(
            dists, kind="+".join(kinds), responses=sum(p.responses for p in have), chunks=sum(p.chunks for p in have)
        )


@dataclass(kw_only=True)
class Tokens(Section):
    """Output tokens of an OpenAI-compatible endpoint (``bench --openai``), counted as vLLM's
    benchmark counts them: docs/bench.md defines each figure and where they differ.

    Combined: counts summed, ``tpot`` recomputed from the merged distributions;
    ``output_tokens_per_s`` and ``total_tokens_per_s`` (each run's own window) left out, with a note."""

    #: "chat" (/v1/chat/completions) or "completions" (/v1/completions)
    api: str = "chat"
    model: str | None = None
    #: successful responses, and the output tokens they carried
    responses: int = 0
    output_tokens: int = 0
    #: how each response's count was had: its ``usage.completion_tokens``, its streamed events
    #: with text (the server sent no usage), or neither (a plain answer without usage: not counted)
    from_usage: int = 0
    from_deltas: int = 0
    uncounted: int = 0
    #: ``usage.prompt_tokens`` summed, when every response counted from usage had it
    input_tokens: int | None = None
    #: the counted responses' ``max_tokens`` summed (None when one asked for none), and the
    #: responses that stopped before theirs (the model's end of answer, a stop word)
    asked_output_tokens: int | None = None
    short_answers: int = 0
    #: output tokens of the measured window, per second of it
    output_tokens_per_s: float | None = None
    #: input and output tokens, per second (when ``input_tokens`` is known)
    total_tokens_per_s: float | None = None
    #: per request with two tokens or more: (latency - TTFT) / (output tokens - 1), vLLM's TPOT
    tpot: Summary | None = None
    distributions: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def shortfall(self) -> str | None:
        """What the report says when answers stopped before their ``max_tokens``: a run meant
        as "M tokens out" that produced fewer."""
        if not self.short_answers:
            return None
        asked = f"asked {self.asked_output_tokens:,} tokens, got {self.output_tokens:,}" if self.asked_output_tokens else "fewer tokens than asked"
        return (
            f"{self.short_answers} of {self.responses} answers stopped before their max_tokens ({asked}): the model "
            "ended them; --ignore-eos asks vLLM and SGLang to run each answer to its max_tokens"
        )

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Tokens | None:
        have: list[Tokens] = [p for p in parts if p is not None]
        if not have:
            return None
        for name in ("output_tokens_per_s", "total_tokens_per_s"):
            if any(getattr(p, name) is not None for p in have):
                notes[f"load.tokens.{name}"] = "each run's rate is over its own window, which may or may not overlap the others'"
        out = cls(api="+".join(sorted({p.api for p in have})), model=have[0].model)
        for name in ("responses", "output_tokens", "from_usage", "from_deltas", "uncounted", "short_answers"):
            setattr(out, name, sum(getattr(p, name) for p in have))
        for name in ("input_tokens", "asked_output_tokens"):
            values = [getattr(p, name) for p in have]
            setattr(out, name, None if None in values else sum(v for v in values if v is not None))
        tpots = [Distribution.from_dict(p.distributions["tpot"], where="load.tokens.distributions.tpot") for p in have if "tpot" in p.distributions]
        if tpots:
            merged = tpots[0]
            for d in tpots[1:]:
                merged = merged.merge(d)
            out.tpot, out.distributions = summarize(merged), {"tpot": merged.to_dict()}
        return out


@dataclass(kw_only=True)
class SizeBucket(Section):
    """Requests whose input size falls in ``[smallest, largest]`` (``load.by_size``)."""

    #: the smallest and largest input size among the bucket's requests
    smallest: int = 0
    largest: int = 0
    #: "bytes" (the request body) or "chars" (``--openai``: the prompt's characters)
    unit: str = "bytes"
    #: requests that succeeded, and that failed
    count: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    #: streamed responses: time to first token
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None


@dataclass(kw_only=True)
class SloCheck(Section):
    """One objective of ``--slo``, judged on the run: the run's figure, and whether it met it."""

    objective: str
    #: the run's figure (ms); null when not measured (then not met)
    value_ms: float | None = None
    met: bool = False
    #: why it could not be judged, when it could not
    note: str | None = None


@dataclass(kw_only=True)
class Slo(Section):
    """``--slo``: whether the run met each objective, and its goodput (docs/bench.md).
    Not combined: ``slo.judge`` judges a combined report again from its distributions."""

    key: ClassVar[str] = "slo"

    slo: str = ""
    met: bool = False
    checks: list[SloCheck] = field(default_factory=list)
    #: successful requests whose own figures met every objective
    good: int = 0
    #: ``good`` per second of the measured window
    goodput_rps: float | None = None


@dataclass(kw_only=True)
class Window(Section):
    """One window of the ``Timeline``: the measured requests that *started* in it (open loop:
    were due in it), and their latencies as the headline counts them."""

    #: the window's start, in seconds from the start of the measured window
    start_s: float = 0.0
    ok: int = 0
    errors: int = 0
    #: the successes' latency (null when none succeeded)
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None


@dataclass(kw_only=True)
class Timeline(Section):
    """Latency over time: the measured window cut into at most ~120 windows of ``window_s``
    (``servescope.load.timeline``), so a stall shows where it happened. Not combined: each run's
    windows are offsets into its own run."""

    window_s: float = 1.0
    windows: list[Window] = field(default_factory=list)


@dataclass(kw_only=True)
class WarmupBacklog(Section):
    """Open loop over capacity: ``requests`` due in the warm-up were still unanswered when the
    measured window opened, the oldest due ``oldest_ms`` before it; their queue is in the
    window's latencies."""

    requests: int = 0
    oldest_ms: float = 0.0


@dataclass(kw_only=True)
class TurnRow(Section):
    """One turn of the conversations (``load.sessions.by_turn``): its measured requests."""

    #: the turn, from 1
    turn: int = 0
    requests: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    #: the mean prompt, history included, in ``unit``
    prompt_mean: float = 0.0
    unit: str = "chars"


@dataclass(kw_only=True)
class Sessions(Section):
    """``bench --turns N``: conversations whose history grows, turn by turn (docs/bench.md)."""

    turns: int = 0
    #: the pause between an answer's end and the next turn
    think_ms: float = 0.0
    #: conversations started, run to their last turn, and cut (by the run's end, or a failed turn)
    started: int = 0
    completed: int = 0
    cut: int = 0
    by_turn: list[TurnRow] = field(default_factory=list)


@dataclass(kw_only=True)
class Http(Section):
    """Where a request's time went on the wire (``load.http``): the connections' set-up, and
    each measured success's time to its first byte and from there to its last. Combined:
    figures recomputed from the merged distributions, counts summed."""

    #: connections opened in the level (warm-up included), and the host's name lookup (once a run)
    connections: int = 0
    dns_ms: float | None = None
    #: each new connection's TCP handshake, and its TLS handshake (https only)
    connect: Summary | None = None
    tls: Summary | None = None
    #: from the request's bytes written to the response's first byte (the server's time, and the network's)
    ttfb: Summary | None = None
    #: from the first byte to the last (a streamed answer's whole stream)
    transfer: Summary | None = None
    distributions: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_distributions(cls, dists: dict[str, Distribution], **kwargs: Any) -> Http:
        out = cls(**kwargs, distributions={name: d.to_dict() for name, d in dists.items()})
        for name, d in dists.items():
            if len(d):
                setattr(out, name, summarize(d))
        return out

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Http | None:
        have: list[Http] = [p for p in parts if p is not None]
        if not have:
            return None
        dists = merged_distributions(have, "load.http")
        dns = [p.dns_ms for p in have if p.dns_ms is not None]
        return cls.from_distributions(dists, connections=sum(p.connections for p in have), dns_ms=max(dns) if dns else None)


@dataclass(kw_only=True)
class Load(Section):
    """What ``servescope bench`` measured beside the latency statistics.

    Combined: ``requests``, ``server_timing`` counts and ``replicas`` are summed, ``generators``
    and ``generators_lost`` joined, ``first_error`` and ``first_error_body`` kept from the first
    report that has one;
    ``throughput_rps`` (the runs' windows may overlap or not), ``uncorrected`` and ``generator``
    (percentiles, which are never averaged), ``slo`` and ``timeline`` are left out, with a note."""

    key: ClassVar[str] = "load"

    throughput_rps: float | None = None
    requests: Requests | None = None
    #: latency from the actual send (open loop: without the coordinated-omission correction)
    uncorrected: dict[str, float | None] | None = None
    server_timing: ServerTimingCounts | None = None
    generator: GeneratorHealth | None = None
    #: replica id -> answers, from ``replica;desc=...`` in the Server-Timing
    replicas: dict[str, int] = field(default_factory=dict)
    #: the cold first request's error
    first_error: str | None = None
    #: the run's first answer >= 400 with (the start of) its body: "HTTP 422: {...}"
    first_error_body: str | None = None
    generators: list[GeneratorRow] = field(default_factory=list)
    #: why each lost generator was lost (the others' results are kept)
    generators_lost: list[str] = field(default_factory=list)
    #: streamed responses' figures (TTFT, ITL ...), when responses were streamed
    stream: Stream | None = None
    #: with ``--slo``: each objective judged, and the goodput
    slo: Slo | None = None
    #: latency over time, window by window
    timeline: Timeline | None = None
    #: ``--openai``: output tokens, their rate and vLLM's TPOT
    tokens: Tokens | None = None
    #: requests of different input sizes: latency by size bucket (quartiles of the sizes sent)
    by_size: list[SizeBucket] = field(default_factory=list)
    #: open loop: the warm-up's requests still waiting when the measured window opened
    warmup_backlog: WarmupBacklog | None = None
    #: connection set-up, time to first byte and transfer of each request
    http: Http | None = None
    #: ``--turns``: the conversations, turn by turn
    sessions: Sessions | None = None
    #: ``--scrape``: the server's own metrics over the measured window (load/telemetry.py)
    server_metrics: telemetry.ServerMetrics | None = None
    #: this machine's GPUs over the measured window (NVML), when it has any
    gpu: telemetry.Gpu | None = None

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Load | None:
        have: list[Load] = [p for p in parts if p is not None]
        if not have:
            return None
        out = Load()
        for name, why in (
            ("throughput_rps", "each run's throughput is over its own window, which may or may not overlap the others'"),
            ("uncorrected", "percentiles are never averaged, and these keep no distribution to merge"),
            ("generator", "schedule-lag percentiles are never averaged, and these keep no distribution to merge"),
            ("slo", "goodput is judged request by request within one run; judge the combined figures again (servescope.load.slo.judge)"),
            ("timeline", "each run's windows are offsets into its own run, whose clock the others do not share, and "
             "per-window percentiles keep no distribution to merge"),
            ("warmup_backlog", "each run's warm-up left its own queue"),
            ("sessions", "each run's conversations are its own; their turns' percentiles keep no distribution to merge"),
            ("server_metrics", "each run's scrapes are of its own window; the series' ranges and bucket estimates do not add up"),
            ("gpu", "each run sampled the GPUs over its own window"),
        ):
            if any(getattr(p, name) is not None for p in have):
                notes[f"load.{name}"] = why
        requests = [p.requests for p in have if p.requests is not None]
        if requests:
            out.requests = Requests(**{f: sum(getattr(r, f) for r in requests) for f in ("measured", "ok", "warmup")})
        timing = [p.server_timing for p in have if p.server_timing is not None]
        if timing:
            counts = {f: sum(getattr(t, f) for t in timing) for f in ("responses_with_header", "malformed", "too_large")}
            hint = None if counts["responses_with_header"] else next((t.hint for t in timing if t.hint), None)
            out.server_timing = ServerTimingCounts(**counts, hint=hint)
        for p in have:
            for rid, n in p.replicas.items():
                out.replicas[rid] = out.replicas.get(rid, 0) + n
            out.generators.extend(p.generators)
            out.generators_lost.extend(p.generators_lost)
        out.replicas = dict(sorted(out.replicas.items()))
        out.first_error = next((p.first_error for p in have if p.first_error), None)
        out.first_error_body = next((p.first_error_body for p in have if p.first_error_body), None)
        out.stream = Stream.combine([p.stream for p in have], notes)
        out.tokens = Tokens.combine([p.tokens for p in have], notes)
        out.http = Http.combine([p.http for p in have], notes)
        if any(p.by_size for p in have):
            notes["load.by_size"] = "each run's buckets are the quartiles of its own sizes, and keep no distribution to merge"
        return out


# Load's --scrape and GPU sections subclass Section, so they are imported once it exists; Load's
# field types name them through the module, resolved when a report is read or written.
from ..load import telemetry  # noqa: E402
