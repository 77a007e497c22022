"""py-spy's Chrome trace events as each thread's stacks over time.

py-spy writes a ``B`` (begin) event when a frame appears in a thread's sampled stack and an
``E`` (end) when it is gone, at the sample's time in microseconds; with ``--threads`` each
thread's root is a pseudo-frame ``thread (OS_TID): NAME``. Replaying them gives, per thread,
spans of time during which its stack stayed the same: the samples, weighted by time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["Frame", "Span", "Thread", "threads_of"]


@dataclass(frozen=True)
class Frame:
    name: str  # the function's qualified name (Module._call_impl)
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line} {self.name}"


@dataclass
class Span:
    t0_us: int
    t1_us: int
    frames: tuple[Frame, ...]  # outermost first

    @property
    def ms(self) -> float:
        return (self.t1_us - self.t0_us) / 1000


@dataclass
class Thread:
    pid: int
    tid: int
    name: str = ""
    spans: list[Span] = field(default_factory=list)


def threads_of(events: Iterable[dict[str, Any]], shift_us: int = 0) -> list[Thread]:
    """Each (process, thread)'s spans from the events, in time order; ``shift_us`` is added to
    every time (to put recordings on one clock)."""
    threads: dict[tuple[int, int], Thread] = {}
    stacks: dict[tuple[int, int], list[Frame]] = {}
    last: dict[tuple[int, int], int] = {}
    for e in events:
        ph = e.get("ph")
        if ph not in ("B", "E"):
            continue
        key = (int(e.get("pid", 0)), int(e.get("tid", 0)))
        ts = int(e.get("ts", 0)) + shift_us
        th = threads.get(key)
        if th is None:
            th = threads[key] = Thread(*key)
            stacks[key], last[key] = [], ts
        stack = stacks[key]
        if ts > last[key] and stack:
            th.spans.append(Span(last[key], ts, tuple(stack)))
        last[key] = max(last[key], ts)
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        if not args.get("filename") and name.startswith("thread ("):  # the root pseudo-frame
            th.name = name.split(": ", 1)[1] if ": " in name else name
            continue
        frame = Frame(name, str(args.get("filename", "")), int(args.get("line", 0) or 0))
        if ph == "B":
            stack.append(frame)
        elif stack:
            # (an E closes the innermost frame of that name: py-spy closes inner frames first)
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == frame:
                    del stack[i:]
                    break
    return [t for t in threads.values() if t.spans]
