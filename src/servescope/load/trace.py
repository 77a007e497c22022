"""``bench --trace FILE.jsonl``: replay a trace's arrival times and sizes, open loop.

    trace = read_trace("trace.jsonl")           # one request a line, sorted by time
    offsets = trace.offsets_ns(speedup=2.0)     # when each is due, from the run's start

A line is the public LLM traces' shape (Mooncake's, Azure's once renamed):
``{"timestamp": 27482, "input_length": 6955, "output_length": 52}``, the timestamp in ms from
any origin (the first request is sent at the run's start), the lengths in tokens. With
``--openai`` each request's prompt is built to ``input_length`` tokens and asks for
``output_length`` (``max_tokens``); without it, the lines give only the times, and the bodies
(``--body``, ``--data``) are sent in turn. Other fields (``hash_ids`` ...) are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..exceptions import ConfigError

__all__ = ["MAX_TRACE_LINES", "Trace", "read_trace"]

#: every request of a trace is built before the run; past this many lines, a sample is asked for
MAX_TRACE_LINES = 1_000_000


@dataclass(frozen=True)
class Trace:
    """A trace's requests in time order: when each was due (ms, from the first), and its sizes
    (None where the line gave none)."""

    path: str
    times_ms: list[float]
    input_lengths: list[int | None]
    output_lengths: list[int | None]

    def __len__(self) -> int:
        return len(self.times_ms)

    @property
    def span_s(self) -> float:
        return self.times_ms[-1] / 1000 if self.times_ms else 0.0

    def offsets_ns(self, speedup: float = 1.0) -> list[int]:
        return [round(t * 1e6 / speedup) for t in self.times_ms]

    def needs_sizes(self) -> None:
        """A ``ConfigError`` naming the first line without ``input_length`` and ``output_length``
        (``--openai`` builds each request from them)."""
        for i, (n_in, n_out) in enumerate(zip(self.input_lengths, self.output_lengths)):
            if n_in is None or n_out is None:
                raise ConfigError(f"trace {self.path!r}: request {i + 1} (in time order) has no input_length and output_length: --openai builds each request from them")


def _length(value: object, name: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {name} must be a whole number of tokens >= 1, got {value!r}")
    return value


def read_trace(path: str, *, limit: int | None = None) -> Trace:
    """The trace in ``path`` (JSON lines), sorted by timestamp (a stable sort: lines at the
    same time keep their order); ``limit``: its first requests in time only. A line that does
    not parse, or lacks a usable timestamp, is a ``ConfigError`` naming the file and the line."""
    name = str(path)
    rows: list[tuple[float, int | None, int | None]] = []
    try:
        with open(Path(path), "rb") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                where = f"trace {name!r} line {number}"
                try:
                    item = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ConfigError(f"{where} is not JSON: {exc}") from None
                if not isinstance(item, dict):
                    raise ConfigError(f'{where}: expected an object like {{"timestamp": 0, "input_length": 512, "output_length": 128}}')
                ts = item.get("timestamp")
                if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
                    raise ConfigError(f"{where}: timestamp must be a number of ms >= 0, got {ts!r}")
                rows.append((float(ts), _length(item.get("input_length"), "input_length", where), _length(item.get("output_length"), "output_length", where)))
                if len(rows) > MAX_TRACE_LINES:
                    raise ConfigError(f"trace {name!r} has more than {MAX_TRACE_LINES:,} requests: give a part of it (head -n 100000)")
    except OSError as exc:
        raise ConfigError(f"cannot read trace {name!r}: {exc.strerror or exc}") from None
    if not rows:
        raise ConfigError(f"trace {name!r} has no request")
    rows.sort(key=lambda row: row[0])
    rows = rows[:limit] if limit else rows
    first = rows[0][0]
    return Trace(name, [t - first for t, _, _ in rows], [r[1] for r in rows], [r[2] for r in rows])
