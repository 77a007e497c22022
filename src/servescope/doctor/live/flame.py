"""The samples of ``doctor --pid`` as flame graphs, grouped by stage: a speedscope file
(open it in speedscope: its npm package runs offline) and a collapsed-stack file
(``stage;frame;frame weight`` per line, for flamegraph.pl or inferno). Weights are
microseconds of wall time; time outside any request is under ``(not in a request)``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson

from .stages import in_request, stage_of
from .trace import Frame, Thread

__all__ = ["stacks_by_stage", "write_flames"]

OUTSIDE = "(not in a request)"


def stacks_by_stage(threads: list[Thread]) -> Counter[tuple[str, ...]]:
    """(stage, frame, frame, ...) -> microseconds, frames outermost first as ``function (file:line)``."""
    out: Counter[tuple[str, ...]] = Counter()
    for th in threads:
        for s in th.spans:
            stage = stage_of(s.frames) if in_request(s.frames) else OUTSIDE
            out[(stage, *(_label(f) for f in s.frames))] += s.t1_us - s.t0_us
    return out


def _label(f: Frame) -> str:
    return f"{f.name} ({f.file}:{f.line})"


def write_flames(threads: list[Thread], folder: str) -> dict[str, str]:
    """Both files into ``folder`` (made if need be); their paths."""
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    stacks = stacks_by_stage(threads)
    collapsed = where / "flame.collapsed.txt"
    collapsed.write_text("".join(f"{';'.join(k)} {v}\n" for k, v in sorted(stacks.items())))
    frames: dict[str, int] = {}
    samples, weights = [], []
    for key, us in sorted(stacks.items()):
        samples.append([frames.setdefault(name, len(frames)) for name in key])
        weights.append(us)
    doc = {
        "shared": {"frames": [{"name": name} for name in frames]},
        "profiles": [
            {"type": "sampled", "name": "servescope doctor --pid, by stage", "unit": "microseconds",
             "startValue": 0, "endValue": sum(weights), "samples": samples, "weights": weights}
        ],  # fmt: skip
        "name": "servescope doctor --pid",
        "exporter": "servescope",
    }
    speedscope = where / "flame.speedscope.json"
    speedscope.write_bytes(orjson.dumps(doc))
    return {"speedscope": str(speedscope), "collapsed": str(collapsed)}
