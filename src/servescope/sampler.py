"""A small sampling profiler, for naming the hot spot inside a slow stage."""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
from typing import Any

__all__ = ["Sampler"]


class Sampler:
    """A small sampling profiler: every ``interval`` it notes where each thread is
    (the innermost frame outside servescope and the threading machinery), with a timestamp,
    so samples can be attributed to the stage whose time window they fall in."""

    _SKIP = ("servescope" + os.sep, os.sep + "threading.py", os.sep + "concurrent" + os.sep, os.sep + "selectors.py")

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.samples: list[tuple[int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="servescope-sampler")

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(1)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            now = time.perf_counter_ns()
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                where = self._where(frame)
                if where:
                    self.samples.append((now, tid, where))

    _IDLE = ("queue.py", "socket.py", "selectors.py", "threading.py", "base_events.py", "runners.py", "ssl.py", "socketserver.py")

    def _where(self, frame: Any) -> str | None:
        if frame.f_code.co_filename.endswith(self._IDLE):  # a thread waiting, not working
            return None
        f = frame
        while f is not None:
            name = f.f_code.co_filename
            if not any(part in name for part in self._SKIP):
                short = os.sep.join(name.split(os.sep)[-2:])
                return f"{short}:{f.f_lineno} {f.f_code.co_name}"
            f = f.f_back
        return None

    def hot_spots(self, windows: dict[str, list[tuple[int, int]]], top: int = 2) -> dict[str, str]:
        """Per stage: the top frames among the samples inside its windows, with their share."""
        out = {}
        for stage_name, spans in windows.items():
            if not spans:
                continue
            spans = sorted(spans)
            starts = [lo for lo, _ in spans]
            counts: dict[str, int] = {}
            n = 0
            for t, _, where in self.samples:
                i = bisect.bisect_right(starts, t) - 1
                if i >= 0 and t <= spans[i][1]:
                    counts[where] = counts.get(where, 0) + 1
                    n += 1
            if n:
                best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
                out[stage_name] = "; ".join(f"{w} ({c * 100 // n}% of {n} samples)" for w, c in best)
        return out
