"""Forwards in parallel lanes: a batch's forwards (its groups of similar length) shared
between the worker thread and helper threads, each running its forwards at a share of the
CPUs' threads.

On a CPU a small model's parallel regions scale poorly: MiniLM on two cores ran 83 items/s
as one forward at a time on two threads, 97-101 as two forwards at once on one thread each,
and 53 -> 67 beside a process that kept a core busy (docs/benchmarks.md, session 12). A
FastAPI ``def`` route already calls its model from several threads at once, so a model
served here may be too; ``lanes=1`` keeps one forward at a time.

    lanes = Lanes(2)
    todo = lanes.order(costs)             # the forwards, heaviest first: each lane pops the next
    lanes.submit(1, job)                  # a helper runs ``job()``; False when it is still busy

Only forwards run in the lanes (collate, the copies, infer, split): validation, preprocess,
postprocess and serialize stay on the worker thread, one at a time, as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Any, Callable

__all__ = ["Lanes"]

log = logging.getLogger("servescope")


class _Helper:
    """One helper thread taking jobs from its own queue; ``busy`` while it runs one."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job()
            except Exception:  # a bug of ours: said, and the helper stays for the next batch
                log.exception("servescope: a lane's job failed")
            finally:
                self.busy = False


class Lanes:
    """``count`` lanes: the calling thread is lane 0, helper threads the others."""

    def __init__(self, count: int, *, name: str = "servescope-lane") -> None:
        self.count = count
        self._helpers = [_Helper(f"{name}-{i}") for i in range(1, count)]

    @staticmethod
    def order(costs: list[float]) -> deque[int]:
        """The forwards (their indexes in ``costs``) heaviest first, for the lanes to take one
        at a time as each comes free: the lanes end together (longest-processing-time first)
        even when one runs slower (a neighbour took its core), as no fixed split does."""
        return deque(sorted(range(len(costs)), key=lambda i: -costs[i]))

    def submit(self, lane: int, job: Callable[[], Any]) -> bool:
        """Run ``job()`` on helper ``lane`` (1 and up); False (nothing run) when that helper is
        still busy, as one left in a stuck forward is: the caller runs the job itself."""
        helper = self._helpers[lane - 1]
        if helper.busy:
            return False
        helper.busy = True
        helper.jobs.put(job)
        return True
