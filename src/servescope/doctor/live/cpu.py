"""A live process's CPU from outside, per thread (Linux ``/proc/PID/task/TID/schedstat``: time
on a CPU, and time runnable but waiting for one), summed over the process and its workers;
and the GIL's use, from a py-spy recording with ``--gil`` (each sample holds the thread that
held the GIL then, or none)."""

from __future__ import annotations

import time
from pathlib import Path

from .trace import Thread

__all__ = ["ProcessCpu", "gil_busy_share"]


def _read(pids: list[int]) -> tuple[int, int] | None:
    cpu = wait = 0
    seen = False
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                on, queued, _ = stat.read_text().split()
            except (OSError, ValueError):
                continue  # (a thread that ended between the listing and the read)
            cpu, wait, seen = cpu + int(on), wait + int(queued), True
    return (cpu, wait) if seen else None


class ProcessCpu:
    """Cores the processes kept busy, and cores' worth of their threads' waits for a CPU (a
    thread ready to run while every CPU it may use is taken: by its own siblings, or by other
    processes), between construction and ``since()``. None where the OS does not say."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.t0, self.first = time.perf_counter(), _read(self.pids)

    def since(self) -> tuple[float | None, float | None]:
        now, wall = _read(self.pids), time.perf_counter() - self.t0
        if now is None or self.first is None or wall <= 0:
            return None, None
        return round((now[0] - self.first[0]) / 1e9 / wall, 2), round((now[1] - self.first[1]) / 1e9 / wall, 2)


def gil_busy_share(gil_threads: list[Thread], seconds: float) -> dict[int, float]:
    """Per process: the share of ``seconds`` during which one of its threads held the GIL."""
    held: dict[int, float] = {}
    for th in gil_threads:
        held[th.pid] = held.get(th.pid, 0.0) + sum(s.t1_us - s.t0_us for s in th.spans) / 1e6
    return {pid: round(min(t / seconds, 1.0), 3) for pid, t in held.items()} if seconds > 0 else {}
