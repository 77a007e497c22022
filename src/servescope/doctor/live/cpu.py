"""A live process's CPU from outside, per thread (Linux ``/proc/PID/task/TID/schedstat``: time
on a CPU, and time runnable but waiting for one), summed over the process and its workers;
and the GIL's use, from a py-spy recording with ``--gil`` (each sample holds the thread that
held the GIL then, or none)."""

from __future__ import annotations

import time
from pathlib import Path

from .stages import in_request
from .trace import Thread

__all__ = ["ProcessCpu", "gil_busy_share"]


def _read(pids: list[int]) -> dict[tuple[int, int], tuple[int, int]]:
    """(pid, tid) -> (ns on a CPU, ns runnable but waiting for one), for every thread now."""
    out = {}
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                on, queued, _ = stat.read_text().split()
                out[(pid, int(stat.parent.name))] = (int(on), int(queued))
            except (OSError, ValueError):
                continue  # (a thread that ended between the listing and the read)
    return out


#: A thread that used this share of a core during a phase is one of the process's busy threads
BUSY_THREAD = 0.1


class ProcessCpu:
    """Cores the processes kept busy, cores' worth of their threads' waits for a CPU (a thread
    ready to run while every CPU it may use is taken: by its own siblings, or by other
    processes), and how many of their threads were busy, between construction and ``since()``
    (threads that ended in between are not counted). None where the OS does not say."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.t0, self.first = time.perf_counter(), _read(self.pids)

    def since(self) -> tuple[float | None, float | None, int | None]:
        now, wall = _read(self.pids), time.perf_counter() - self.t0
        if not now or not self.first or wall <= 0:
            return None, None, None
        deltas = [(on - self.first[k][0], queued - self.first[k][1]) for k, (on, queued) in now.items() if k in self.first]
        deltas += [v for k, v in now.items() if k not in self.first]  # (started during the phase)
        busy = sum(1 for on, _ in deltas if on / 1e9 / wall >= BUSY_THREAD)
        return round(sum(on for on, _ in deltas) / 1e9 / wall, 2), round(sum(q for _, q in deltas) / 1e9 / wall, 2), busy


def gil_busy_share(gil_threads: list[Thread], seconds: float) -> dict[int, float]:
    """Per process: the share of ``seconds`` during which one of its threads held the GIL for a
    request's work (a runtime's own thread holding it while it waits in C is not the requests')."""
    held: dict[int, float] = {}
    for th in gil_threads:
        held[th.pid] = held.get(th.pid, 0.0) + sum(s.t1_us - s.t0_us for s in th.spans if in_request(s.frames)) / 1e6
    return {pid: round(min(t / seconds, 1.0), 3) for pid, t in held.items()} if seconds > 0 else {}
