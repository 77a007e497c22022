"""torch's intra-op threads, chosen at start-up and, unless the user fixed them, adapted while
serving: a neighbour that takes a core makes a forward at every core's thread count 5-16x
slower (a parallel region waits for its thread that shares a core), so the count that is
fastest is measured, not assumed.

    choice = thread_choice(None, cpus=2.0)              # (2, "the CPUs available")
    tuner = ThreadTuner(apply=torch.set_num_threads, start=2, choices=[2, 1])
    n = tuner.next()                                    # the count the next forward runs at
    tuner.record(n, forward_ns, items)                  # what it took

The tuner explores at its first forwards, then runs settled at one count. Now and then (and
at once when the settled forwards grow 1.5x slower than at the last decision) it explores
again: the next forwards alternate between the counts (A B A B, so a change in the machine
hits both alike), and the count whose median time per item (per token, for inputs with a
length) is lowest by a margin is kept. A
count plainly worse after two tries (or far worse after one) is dropped from the rest (each
of its forwards is a slow request). An exploration that keeps the count waits twice as long before the next one (up to
``MAX_PERIOD_S``); a switch starts over from ``PERIOD_S``.
The clock is injected (tests drive it by hand).
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from typing import Callable

__all__ = ["ThreadTuner", "thread_choice", "thread_choices"]

log = logging.getLogger("servescope.serve")

#: seconds between explorations after a switch, and at most after explorations that kept the count
PERIOD_S, MAX_PERIOD_S = 10.0, 120.0
#: forwards per count in an exploration; a count is kept only when another's median per-item
#: time is below this share of its own
SAMPLES, MARGIN = 5, 0.85
#: the settled forwards' median per item, this many times the one at the decision: explore now
DRIFT = 1.5
#: a count tried twice whose fastest forward is this many times slower than the current
#: count's median is not tried again in this exploration; tried once, this many times slower
#: (a neighbour's core: 5-16x), not even a second time (each such forward holds every request
#: queued behind it: the p99 of the whole window)
HOPELESS, HOPELESS_AT_ONCE = 2.0, 4.0


def thread_choice(requested: int | None, cpus: float) -> tuple[int, str]:
    """torch's intra-op threads and where the number came from: ``threads=`` (``--threads``),
    else the user's own ``OMP_NUM_THREADS`` (a container's or a launcher's, kept as they set
    it), else the CPUs this process may use (then adapted while serving: ``ThreadTuner``)."""
    if requested:
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    return max(1, int(cpus)), "the CPUs available"


def thread_choices(start: int) -> list[int]:
    """The counts to try from ``start``: itself, half, and one."""
    return sorted({start, max(1, start // 2), 1}, reverse=True)


class ThreadTuner:
    """Picks the thread count of each forward from what forwards took (see the module)."""

    def __init__(
        self,
        *,
        apply: Callable[[int], None],
        start: int,
        choices: list[int],
        clock: Callable[[], float] = time.monotonic,
        on_switch: Callable[[int, int, str], None] | None = None,
        first_in_s: float = 0.0,
    ) -> None:
        self._apply, self._clock, self._on_switch = apply, clock, on_switch
        self.current = start
        self.choices = choices
        self.period_s = PERIOD_S
        self._next_at = clock() + first_in_s  # (at once by default: a neighbour may be there from the start)
        self._plan: list[int] = []  # the exploration's forwards still to run, in order
        self._seen: dict[int, list[float]] = {}
        self._settled: deque[float] = deque(maxlen=16)
        self._reference: float | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self.explorations = self.switches = 0
        self.unit = "item"  # what a forward's time is divided by

    def next(self) -> int:
        """The count the next forward runs at, applied on the calling thread (each thread that
        runs forwards has its own pool size)."""
        with self._lock:
            if not self._plan and self._clock() >= self._next_at:
                self._explore()
            n = self._plan[0] if self._plan else self.current
        if getattr(self._local, "threads", None) != n:
            self._apply(n)
            self._local.threads = n
        return n

    def pin(self, n: int) -> None:
        """Run this thread's forwards at ``n`` threads until the next ``next()`` (a forward
        in a lane, beside others: serve/lanes.py); nothing is recorded."""
        if getattr(self._local, "threads", None) != n:
            self._apply(n)
            self._local.threads = n

    def record(self, threads: int, forward_ns: int, items: int, tokens: int | None = None) -> None:
        """What a forward run at ``threads`` took, for ``items`` items; ``tokens``: items x the
        longest, for inputs with a length (a forward is timed per token then, so that long and
        short requests compare: texts cycled in order would otherwise give one count the long
        ones and the other the short)."""
        if tokens:
            self.unit = "token"
        per_item = forward_ns / max(tokens or items, 1)
        with self._lock:
            if self._plan and self._plan[0] == threads:
                self._plan.pop(0)
                self._seen.setdefault(threads, []).append(per_item)
                self._drop_hopeless()
                if not self._plan:
                    self._decide()
            elif not self._plan and threads == self.current:
                self._settled.append(per_item)
                if self._reference is not None and len(self._settled) >= 8:
                    if statistics.median(self._settled) > DRIFT * self._reference:
                        self._next_at = self._clock()  # the machine changed: explore at the next forward

    def _explore(self) -> None:
        others = [c for c in self.choices if c != self.current]
        if not others:
            self._next_at = float("inf")
            return
        self.explorations += 1
        self._seen = {}
        self._plan = [n for _ in range(SAMPLES) for n in (self.current, *others)]

    def _drop_hopeless(self) -> None:
        """A count whose fastest forward so far is slower than ``HOPELESS`` times the current
        count's median is dropped from the rest of the exploration: trying it on (each of its
        forwards is a slow request) cannot change the decision."""
        mine = self._seen.get(self.current, [])
        if len(mine) < 2:
            return
        ref = statistics.median(mine)
        hopeless = {
            n for n, v in self._seen.items()
            if n != self.current and (len(v) >= 2 and min(v) > HOPELESS * ref or min(v) > HOPELESS_AT_ONCE * ref)
        }  # fmt: skip
        if hopeless:
            self._plan = [n for n in self._plan if n not in hopeless]
            if set(self._plan) == {self.current}:  # nothing left to compare with
                self._plan = []

    def _decide(self) -> None:
        medians = {n: statistics.median(v) for n, v in self._seen.items() if v}
        before = self.current
        best = min(medians, key=medians.__getitem__)
        if best != before and medians[best] < MARGIN * medians[before]:
            self.current = best
            self.switches += 1
            self.period_s = PERIOD_S
            why = f"a forward took {medians[best] / 1e6:.3f} ms per {self.unit} at {best} threads, {medians[before] / 1e6:.3f} at {before}"
            log.warning("servescope: torch threads %d -> %d: %s (is other work sharing the CPUs?)", before, best, why)
            if self._on_switch is not None:
                self._on_switch(before, best, why)
        else:
            self.period_s = min(self.period_s * 2, MAX_PERIOD_S)
        self._reference = medians[self.current]
        self._settled.clear()
        self._next_at = self._clock() + self.period_s
