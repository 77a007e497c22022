"""Attribution: the parts of a request that no stage covered, split by where they fall.

Before the first model or transfer call (after validation, or from the handler's real
start) is ``preprocess``; after the last one, until serialization, is ``postprocess``;
model construction seen by the probes is ``load``; the rest stays ``other`` (framework and
network). The windows of those stages are what the sampler's hot spots are read from.
"""

from __future__ import annotations

from typing import Any

from ..timing import OTHER

__all__ = ["construction_window", "split_other", "stage_windows"]

_MODEL_STAGES = ("infer", "to_device", "to_host")


def construction_window(evidence: dict[str, Any] | None) -> tuple[int, int] | None:
    """When the request built a model (perf_counter ns): from the first ``nn.Module.__init__``
    to the last, or on to the loader called next (``torch.load`` after ``Net()``): a model's
    own ``__init__`` goes on after its last submodule's (initialising the weights it made)."""
    ev = evidence or {}
    lo, hi = ev.get("first_init_ns"), ev.get("last_init_ns")
    if lo is None or hi is None:
        return None
    windows = ev.get("load_windows", [])
    if any(a <= hi <= b for a, b in windows):
        return lo, hi  # built inside a loader (from_pretrained): the loader's time covers it
    after = [a for a, _ in windows if a >= hi]
    return lo, (min(after) if after else hi)


def split_other(trace: Any, evidence: dict[str, Any] | None = None) -> dict[str, float]:
    """A trace's stages, with its unstaged time split: before the first model or transfer
    call (after validation) is ``preprocess``; after the last one, until serialization, is
    ``postprocess``. The rest stays ``other`` (framework and network). Model construction
    seen by the probes (first to last ``nn.Module.__init__``) counts as ``load``."""
    durations = dict(trace.durations_ms)
    spans = [s for s in trace.spans() if s[3] == 0]
    built_ns = construction_window(evidence)
    if built_ns is not None and trace.started_ns is not None:
        lo = (built_ns[0] - trace.started_ns) / 1e6
        hi = (built_ns[1] - trace.started_ns) / 1e6
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

    # between model calls (a decode loop's sampling, a second model's input) is the first
    # call's postprocessing as much as the next one's preparation: postprocess
    pre, post = gap(begin, first), gap(last, end) + gap(first, last)
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
    begin, end = _handler_bounds(trace, spans, evidence, first, last)
    return begin, first, last, end


def _handler_bounds(
    trace: Any, spans: list[tuple[str, float, float, int]], evidence: dict[str, Any] | None,
    first: float | None = None, last: float | None = None,
) -> tuple[float, float]:
    """(begin, end) in ms since the trace began of the handler's own work around the model calls
    ``first``..``last`` (without them, the whole request): from the end of validation (or the
    handler's real start) to serialization."""
    first = trace.total_ms if first is None else first
    entered = (evidence or {}).get("handler_start_ns")
    if entered is not None and trace.started_ns is not None:
        # the handler's real start (not the framework's thread hop); a json call inside the
        # handler (its own parsing, a config read) is its work, not the request's validation
        begin = min(max((entered - trace.started_ns) / 1e6, 0.0), first)
    else:
        begin = max((s[2] for s in spans if s[2] <= first and s[0] in ("validate", "receive")), default=0.0)
    last = begin if last is None else last
    end = min((s[1] for s in spans if s[1] >= last and s[0] in ("serialize", "send")), default=trace.total_ms)
    return begin, end


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
    if bounds is None:
        # no model call the probes saw (pure-Python scoring, a library they do not know): the
        # handler's time between validation and serialization stays unstaged, and its samples
        # say where it goes
        begin, end = _handler_bounds(trace, spans, evidence)
        if end > begin:
            out[OTHER] = [(base + int(begin * 1e6), base + int(end * 1e6))]
    else:
        begin, first, last, end = bounds
        out["preprocess"].append((base + int(begin * 1e6), base + int(first * 1e6)))
        out["postprocess"].append((base + int(last * 1e6), base + int(end * 1e6)))
        model = sorted((lo, hi) for name, lo, hi, _ in spans if name in _MODEL_STAGES)
        for (_, prev_end), (next_start, _) in zip(model, model[1:]):
            if next_start > prev_end:  # between two model calls
                out["postprocess"].append((base + int(prev_end * 1e6), base + int(next_start * 1e6)))
    return out
