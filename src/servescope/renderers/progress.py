"""The live line while load runs: elapsed, requests, current throughput, p95, errors."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class BenchProgress:
    """Feeds a rich progress bar from the generator's results, four times a second."""

    def __init__(self, console: Console, *, seconds: float | None, requests: int | None) -> None:
        self.seconds = seconds
        self.requests = requests
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
            transient=True,
            refresh_per_second=4,
            disable=not console.is_terminal,  # a pipe or CI log gets the result, not frames
        )
        self._tasks: dict[str, Any] = {}
        self._seen: dict[str, int] = {}  # local generator: results already shown
        self._done: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self.live = console.is_terminal
        if self.live:  # numpy's first percentile costs milliseconds: paid now, not on the loop mid-run
            np.percentile([0.0], 95)

    def __enter__(self) -> BenchProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def tick(self, label: str, gen: Any) -> None:
        """From a local load generator (its ``progress_since``): what completed since the last tick.
        Nothing at all when no one sees the bar (a pipe, a CI log): the loop's time is the load's."""
        if not self.live:
            return
        n, errors, ok = gen.progress_since(self._seen.get(label, 0))
        self._seen[label] = n
        self.show(label, n, errors, ok)

    def show(self, label: str, requests: int, new_errors: int, ok_ms: list[float]) -> None:
        """``requests`` done so far, and since the last call: ``new_errors`` and the latencies
        of the successes (several generators' windows merged by the caller)."""
        now = time.monotonic()
        if label not in self._tasks:
            total = self.requests if self.requests else (self.seconds or 1.0)
            self._tasks[label] = self.progress.add_task(label, total=total, stats="")
            self._done[label] = self._errors[label] = 0
            self._last[label] = self._started[label] = now
        dt = max(now - self._last[label], 1e-6)
        rate = (requests - self._done[label]) / dt
        self._done[label] = requests
        self._errors[label] += new_errors
        self._last[label] = now
        p95 = f"{np.percentile(ok_ms, 95):.2f} ms" if ok_ms else "-"
        stats = f"{requests} req · {rate:,.0f} req/s · p95 {p95} · errors {self._errors[label]}"
        done = requests if self.requests else now - self._started[label]
        self.progress.update(self._tasks[label], completed=done, stats=stats)
