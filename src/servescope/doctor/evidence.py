"""The doctor's evidence: what each phase of a run measured, as typed records.

The doctor fills them; the rules read them (``rule(evidence) -> list[Finding]``); the
Report carries them as JSON under ``evidence``, so a saved report is diagnosed again
offline. A section is ``None`` when the run could not measure it (``--url`` sees nothing
inside the process; a batch probe that could not replay the input), and ``missing`` says
why: a rule that needs it raises ``MissingEvidence``, and the report lists the rule as
"not checked" with that reason instead of dropping it silently.

    ev = Evidence.from_report(report)
    probe = ev.need("batch_probe")        # raises MissingEvidence("batch probe skipped: ...")
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin, get_type_hints

from ..exceptions import ReportError, ServescopeError

__all__ = [
    "BatchProbe",
    "Cold",
    "Concurrent",
    "Environment",
    "Evidence",
    "Forwards",
    "LoopActivity",
    "Machine",
    "MissingEvidence",
    "Repeated",
    "TORCH_KINDS",
    "Warm",
    "WhatIf",
]


#: The probes' counts that ``doctor --pid`` reads from stack samples instead (the loads: their
#: frames are on the stack while they run).
SEEN_IN_STACKS = frozenset(
    {"torch.load", "load_state_dict", "safetensors", "torch.jit.load", "from_pretrained", "SentenceTransformer", "Module.__init__"}
)


#: ``Forwards.kinds`` whose calls run torch modules (their threads are torch's OpenMP pool)
TORCH_KINDS = frozenset({"torch", "sentence-transformers", "transformers.pipeline"})


class MissingEvidence(ServescopeError, LookupError):
    """A rule needs a measurement this run does not have; the message says why."""


@dataclass
class Forwards:
    """The model calls (outermost ``nn.Module`` calls) seen in one phase."""

    count: int = 0
    per_request: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    max_batch: int = 0
    training: int = 0  # forwards with at least one module in training mode
    training_changes_output: int = 0  # ... among them dropout or batch-norm
    grad: int = 0  # forwards with autograd on
    on_event_loop: int = 0  # forwards that ran on a thread with a running event loop
    param_devices: list[str] = field(default_factory=list)
    input_devices: list[str] = field(default_factory=list)
    mean_ms: float | None = None
    modules: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # torch, onnxruntime, scikit-learn ...
    #: the calls outside torch's modules, as ``Class.method`` (``RandomForestClassifier.predict_proba``)
    calls: list[str] = field(default_factory=list)
    pad_share: float | None = None  # mean share of padding in the calls' attention masks
    frames: int = 0  # calls given a pandas DataFrame (a pipeline that selects columns by name)
    padding_ms_per_request: float | None = None  # each masked call's time x its padding share, per request


@dataclass
class Repeated:
    """Model calls whose inputs were the same in every warm request and in one request with
    the payload varied: work done again whatever the endpoint is asked."""

    calls_per_request: float = 0.0
    ms_per_request: float = 0.0
    modules: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    #: the libraries of those calls (torch, scikit-learn ...) and, outside torch, ``Class.method``
    kinds: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


@dataclass
class Cold:
    """The first request, alone."""

    latency_ms: float = 0.0
    error: str | None = None
    loads: int = 0
    constructed: int = 0
    params_built: int = 0
    load_calls: list[str] = field(default_factory=list)
    #: its own stages (as the warm requests' breakdown splits them), ms
    stage_ms: dict[str, float] = field(default_factory=dict)
    #: a second first request, in a fresh process, when the first was slow with no load to
    #: explain it (one sample is not enough to claim a cold start on), or when the requests load
    #: a model; and that process's p50 of the few requests after it (no probes, one client)
    repeat_ms: float | None = None
    repeat_p50_ms: float | None = None
    repeat_error: str = ""


@dataclass
class Warm:
    """Sequential requests after the first: the breakdown, and what each request did."""

    requests: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    max_ms: float | None = None
    #: a streamed answer: time to its first chunk (p50); None for a plain answer
    first_chunk_p50_ms: float | None = None
    #: a streamed answer: the gaps between its consecutive chunks (p50, p95)
    chunk_gap_p50_ms: float | None = None
    chunk_gap_p95_ms: float | None = None
    #: the process's CPU time over the wall time of the sequential requests: the cores one
    #: request keeps busy alone (torch's intra-op threads: more than one)
    cpu_cores_busy: float | None = None
    #: the process's minor page faults over the sequential requests, per request: memory the
    #: kernel mapped and zeroed afresh (glibc gives a large freed buffer back and maps it again)
    minor_faults_per_request: float | None = None
    loads_per_request: float = 0.0
    load_ms_per_request: float | None = 0.0  # None: doctor --pid could not tell the requests apart (shares only)
    load_calls: list[str] = field(default_factory=list)
    #: loader calls that read the request's own data (a tensor sent in the body, torch.load-ed),
    #: told apart by the varied request: not model loads, and not counted above
    data_loads_per_request: float = 0.0
    constructed_per_request: float = 0.0
    construct_ms_per_request: float = 0.0
    params_built_per_request: float = 0.0  # parameter elements allocated: weights built per request
    module_moves_per_request: float = 0.0
    h2d_per_request: float = 0.0
    d2h_per_request: float = 0.0
    small_copies_per_request: float = 0.0
    unpinned_async_per_request: float = 0.0
    syncs_per_request: float = 0.0
    copy_bytes_per_request: float = 0.0
    forwards: Forwards = field(default_factory=Forwards)
    errors_sample: list[str] = field(default_factory=list)
    #: a decoder recomputing its prefix: calls with token ids one longer each step and no
    #: cache, per request (steps, the ids' lengths at the first and last), and the time those
    #: steps spent beyond what each would cost at the shortest one's (an under-estimate of
    #: what a cache saves: with it, a step reads one new token)
    recompute_steps_per_request: float = 0.0
    recompute_seq_first: int | None = None
    recompute_seq_last: int | None = None
    recompute_ms_per_request: float = 0.0
    #: the tokenizer's ``decode`` called by the endpoint's code on ids one longer each step
    #: (the whole answer turned into text again at every token), per request, and its time
    #: beyond each call at the shortest one's
    redecode_steps_per_request: float = 0.0
    redecode_ids_last: int | None = None
    redecode_ms_per_request: float = 0.0


@dataclass
class LoopActivity:
    """The event loop's thread, sampled during the concurrent phase: how much of the time it
    ran code (rather than waiting for I/O), and the longest such run. Waiting for the GIL
    looks like waiting, so work in other threads is not charged to the loop."""

    samples: int = 0
    busy_samples: int = 0
    busy_share: float = 0.0
    longest_busy_ms: float = 0.0
    hot_spot: str = ""
    #: ... and how much of it the thread was stopped in a blocking wait (a queue's get, a lock,
    #: a socket read: not the loop's own selector), the longest such run, and the code waiting
    waiting_share: float = 0.0
    longest_wait_ms: float = 0.0
    waiting_in: str = ""


@dataclass
class Concurrent:
    """Several callers at once: does it batch, does the loop stall, does it scale."""

    concurrency: int = 0
    requests: int = 0
    errors: int = 0
    throughput_rps: float | None = None
    sequential_rps: float | None = None
    p50_ms: float | None = None
    first_chunk_p50_ms: float | None = None  # a streamed answer: time to its first chunk (p50)
    chunk_gap_p50_ms: float | None = None  # ... and the gaps between its chunks (p50, p95)
    chunk_gap_p95_ms: float | None = None
    forwards: Forwards | None = None  # None from outside the process (--url)
    loop_lag_max_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop: LoopActivity | None = None  # None when the endpoint has no event loop (WSGI, sync function)
    cpu_cores_busy: float | None = None  # process CPU time / wall time during the phase
    gil_wait_p50_ms: float | None = None  # how late a thread that only wants the GIL gets it
    #: the machine's CPUs (those this process may use) no other process used during the phase:
    #: left idle, or used by the doctor's own load helper (a stand-in for clients elsewhere);
    #: None where the OS does not say (not Linux, or a cgroup quota)
    machine_cores_idle: float | None = None
    #: where the phase's load came from: "a helper process" (as a server's clients'), or "this
    #: process" and why (a load generator there shares the GIL with the app; a function's callers are its threads)
    load_from: str = ""
    #: the same load again without the probes and the sampler, as a server runs it: its p50,
    #: its p50 to the first chunk for a streamed answer, and its throughput. The probed phase
    #: runs slower (an embedding endpoint at c=8: 105 ms against 76-78 bare, 85-92 under
    #: uvicorn); None where that run did not finish cleanly
    served_p50_ms: float | None = None
    served_first_chunk_p50_ms: float | None = None
    served_rps: float | None = None
    #: ... and requests one at a time, also without them (just before it): their p50s, the rate
    #: of one caller (from the p50, as ``sequential_rps``) and the process's cores busy meanwhile
    #: (the load comes from the helper process, so the doctor's client is not in it)
    served_alone_p50_ms: float | None = None
    served_alone_first_chunk_p50_ms: float | None = None
    served_alone_rps: float | None = None
    served_alone_cores: float | None = None
    worker_hot_spot: str = ""  # where the threads that are not the loop spent their samples
    #: doctor --pid, from outside: the share of the phase one thread of the process held the
    #: GIL (py-spy --gil), the threads working on requests on average, and the cores' worth of
    #: its threads' waits for a CPU (/proc schedstat)
    gil_busy_share: float | None = None
    threads_in_requests: float | None = None
    cpu_wait_cores: float | None = None
    threads_busy: int | None = None  # ... and how many of its threads (native ones too) used a tenth of a core or more
    processes: int | None = None  # ... and the server's processes (a master and its workers)
    #: model calls seen outside any request (a batcher's own thread): counted, not credited
    background_calls: int = 0
    background_batch_sizes: list[int] = field(default_factory=list)


@dataclass
class BatchProbe:
    """The captured model input replayed alone, without probes, at several batch sizes."""

    per_item_ms: dict[str, float] = field(default_factory=dict)
    best_batch: int | None = None
    gain: float | None = None  # per-item time at batch 1 / at the best batch
    grad_ratio: float | None = None  # autograd on / inference_mode, batch 1
    train_ratio: float | None = None  # as the endpoint runs it / eval(), batch 1
    forward_ms: float | None = None  # batch 1 under inference_mode
    error: str | None = None
    #: on a busy machine, the sizes timed again on a torch pool of ``fewer_threads`` (the CPUs
    #: other processes left free); ``per_item_ms`` is then the better of the two, size by size
    fewer_threads: int | None = None
    per_item_ms_fewer_threads: dict[str, float] = field(default_factory=dict)


@dataclass
class Environment:
    cuda_available: bool = False
    torch_threads: int | None = None
    cpus_available: float | None = None
    workers: int = 1
    blas_threads: int | None = None  # the largest BLAS/OpenMP pool numpy and friends use (threadpoolctl)
    ort_threads: int | None = None  # the largest ONNX Runtime intra-op pool (0 in its options: one per core)
    #: how OpenMP's idle threads wait: the user's setting ("OMP_WAIT_POLICY=PASSIVE"), "default"
    #: (spin, then sleep), or None when no OpenMP runtime is loaded
    omp_wait_policy: str | None = None
    #: the process's malloc ("glibc", "jemalloc", ...; None: cannot tell), and the user's own
    #: setting of it ("MALLOC_TRIM_THRESHOLD_=...", "" for none)
    allocator: str | None = None
    malloc_setting: str = ""


#: why one call for a request's items was not tried when each model object was called once a
#: request (a chain of models, not a loop over items): nothing to merge, and nothing to say
ONE_CALL_EACH = "each model was called once a request: there are no items to run as one call"


@dataclass
class WhatIf:
    """One fix tried on the running endpoint: blocks of requests with the fix applied (B)
    interleaved with blocks of the unchanged endpoint (A), the same body, at ``concurrency``
    callers; ``saving_ms`` is the median of the paired differences of the blocks' medians
    (A - B), with its sign-test interval ``low_ms``-``high_ms`` at ``coverage`` (90% or more
    from five pairs; less with fewer, said). Not tried (``tried`` False) says why in ``why_not``."""

    fix: str = ""
    tried: bool = False
    why_not: str = ""
    concurrency: int = 1
    #: what the p50s and the saving are of: "latency" (the whole answer), "first chunk" for
    #: a streamed answer (time to first token: what its reader waits for), or "mean" at c > 1:
    #: each block's callers over its throughput, the mean time a request spends (Little's law)
    measure: str = "latency"
    pairs: int = 0
    requests: int = 0  # with the fix applied, counted
    base_p50_ms: float | None = None
    fixed_p50_ms: float | None = None
    #: the first request of a fresh process as written, timed alone (doctor/fresh.py)
    base_first_ms: float | None = None
    saving_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    coverage: float | None = None
    pair_diffs_ms: list[float] = field(default_factory=list)  # each pair's A - B, in the order run
    base_rps: float | None = None
    fixed_rps: float | None = None
    #: how the answers compared: "same", "same within float noise", "differ" (expected by the
    #: fix, as eval() with dropout), or "vary from call to call: compared by shape"
    answers: str = ""
    #: how many times the fix took effect in its blocks (a memoised call answered from memory)
    hits: int | None = None
    extra_mb: float | None = None  # memory the fixed blocks held beyond the unchanged ones
    #: minor page faults a request, as written and with the fix (fresh processes: doctor/fresh.py)
    base_faults_per_request: float | None = None
    fixed_faults_per_request: float | None = None
    #: the CPUs while it ran: idle cores, cores other processes used, and the share of time a
    #: runnable task (the doctor's own included) waited for one
    cores_idle: float | None = None
    others_cores: float | None = None
    cpu_pressure: float | None = None
    note: str = ""


@dataclass
class Machine:
    """How busy the machine was while the doctor measured: a busy machine makes every timing
    slower and noisier (the A/B experiments cancel most of it; single samples do not)."""

    cpus_available: float | None = None
    cores_idle: float | None = None  # during the warm requests
    #: cores other processes used during the warm requests (the machine's busy time less the doctor's own)
    others_cores: float | None = None
    #: share of the warm phase during which some runnable task waited for a CPU (/proc/pressure/cpu)
    cpu_pressure: float | None = None
    warm_p90_over_p50: float | None = None  # the spread of the doctor's own warm requests
    busy: bool = False
    why_busy: str = ""


@dataclass
class Evidence:
    """Everything the rules may read. ``stages`` and ``p50_ms`` come from the Report's own
    statistics; the rest from the doctor's phases."""

    target_kind: str = ""
    cold: Cold | None = None
    warm: Warm | None = None
    concurrent: Concurrent | None = None
    batch_probe: BatchProbe | None = None
    environment: Environment | None = None
    repeated: Repeated | None = None
    hot_spots: dict[str, str] = field(default_factory=dict)
    #: stage -> whether its hot spot's top frame is the user's own code
    hot_spots_in_user_code: dict[str, bool] = field(default_factory=dict)
    #: stage -> the source text of its hot spot's top line, when that line is the user's own
    hot_lines: dict[str, str] = field(default_factory=dict)
    #: stage -> each place among its hot spot's top ones that is the user's own line (or the
    #: user's line that called the library code there): ``file:line`` -> its source text
    hot_spot_lines: dict[str, dict[str, str]] = field(default_factory=dict)
    #: the endpoint's own exceptions as its server logged them (doctor/failures.py), each once
    app_exceptions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: section name -> why it is absent (said by the run that left it out)
    missing: dict[str, str] = field(default_factory=dict)
    #: probe name -> why it was switched off mid-run
    probes_disabled: dict[str, str] = field(default_factory=dict)
    #: why the probed measurements were dropped for unprobed ones, when they were
    probes_at_fault: str | None = None
    scaling: float | None = None
    #: fix name -> the fix tried on the endpoint (doctor/experiments/), or why it was not
    experiments: dict[str, WhatIf] = field(default_factory=dict)
    machine: Machine | None = None
    # from the Report, not saved under "evidence"
    stages: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"report": True})
    p50_ms: float = field(default=0.0, metadata={"report": True})
    #: stage -> its share of the typical request: the median over the requests of the stage's
    #: share of each (from the report's per-request samples, where it kept enough of them)
    stage_shares: dict[str, float] = field(default_factory=dict, metadata={"report": True})

    def tried(self, name: str) -> WhatIf | None:
        """The experiment ``name`` when it ran to the end and measured a saving, else None."""
        w = self.experiments.get(name)
        return w if w is not None and w.tried and w.saving_ms is not None else None

    def need(self, name: str) -> Any:
        """The section ``name``, or ``MissingEvidence`` saying why this run has none."""
        value = getattr(self, name)
        if value is None:
            why = self.missing.get(name) or f"this run has no {name.replace('_', ' ')} measurement"
            raise MissingEvidence(why)
        return value

    def need_probes(self, *names: str) -> None:
        """Raise ``MissingEvidence`` when the probes these counts come from were not all on
        for the whole run (switched off mid-run, or dropped because they broke requests)."""
        if self.target_kind == "pid" and not set(names) <= SEEN_IN_STACKS:
            raise MissingEvidence(
                "not visible in a live process's stacks (doctor --pid): what the model was called with and how "
                "(devices, autograd, training mode, inputs) needs the doctor in the process: servescope doctor FILE:app"
            )
        if self.probes_at_fault:
            if self.target_kind == "url":
                raise MissingEvidence(self.probes_at_fault)
            raise MissingEvidence(f"the probes were switched off: {self.probes_at_fault}")
        for name, why in self.probes_disabled.items():
            if any(name.startswith(n) for n in names):
                raise MissingEvidence(f"the {name} probe was switched off mid-run ({why})")

    def missing_error(self, name: str, default: str) -> MissingEvidence:
        """The error for a measurement this run lacks: the run's own reason, or ``default``."""
        return MissingEvidence(self.missing.get(name) or default)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            if not f.metadata.get("report"):
                value = getattr(self, f.name)
                if dataclasses.is_dataclass(value):
                    value = dataclasses.asdict(value)
                elif isinstance(value, dict):
                    value = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in value.items()}
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, **report_fields: Any) -> Evidence:
        """Rebuild from the JSON form; unknown keys are ignored (newer writers), absent ones
        take their defaults (older writers). A value of the wrong type is a ReportError."""
        ev = _build(cls, data, "evidence")
        for k, v in report_fields.items():
            setattr(ev, k, v)
        return ev

    @classmethod
    def from_report(cls, report: Any) -> Evidence:
        data = report.diagnosis.evidence if report.diagnosis is not None else None
        if data is None:
            raise MissingEvidence("this report has no doctor evidence (it was not made by `servescope doctor`)")
        warm_p50 = (data.get("warm") or {}).get("p50_ms") if isinstance(data, dict) else None
        p50 = report.latency.get("p50_ms") or warm_p50 or 0.0
        return cls.from_dict(data, stages=report.stages, p50_ms=float(p50), stage_shares=stage_shares(report.samples))


#: a stage's typical share is read from the requests' own rows where there are this many
MIN_SHARE_SAMPLES = 5


def stage_shares(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Stage -> the median over the requests of its share of each request. The share of the
    mean (the stage's total over the requests' total) moves with the few slowest requests, and
    a stage's p50 over the request's p50 mixes two different requests; on a busy machine,
    where some requests stall in the forward and others do not, either can put a stage that is
    30% of most requests under 25%. A request with no time in a stage counts 0 there."""
    rows = [s for s in samples if isinstance(s, dict) and (s.get("total_ms") or 0) > 0 and isinstance(s.get("stages"), dict) and s["stages"]]
    if len(rows) < MIN_SHARE_SAMPLES:
        return {}
    names = {n for s in rows for n in s["stages"]}
    return {n: round(statistics.median((s["stages"].get(n) or 0.0) / s["total_ms"] for s in rows), 4) for n in names}


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ReportError(f"{where}: expected an object, got {type(data).__name__}")
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data or f.metadata.get("report"):
            continue
        value = data[f.name]
        kwargs[f.name] = _coerce(hints[f.name], value, f"{where}.{f.name}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    options = get_args(hint) if get_origin(hint) is not None and type(None) in get_args(hint) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ReportError(f"{where}: may not be null")
    for opt in options:
        if opt is type(None):
            continue
        if dataclasses.is_dataclass(opt):
            return _build(opt, value, where)
        base = get_origin(opt) or opt
        args = get_args(opt)
        if base is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]) and isinstance(value, dict):
            return {str(k): _build(args[1], v, f"{where}.{k}") for k, v in value.items()}
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool, list, dict) and isinstance(value, base):
            return value
    raise ReportError(f"{where}: unexpected {type(value).__name__} {value!r:.60}")
