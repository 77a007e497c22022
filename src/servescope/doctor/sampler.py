"""A small sampling profiler: where each thread is, every couple of milliseconds.

It answers three of the doctor's questions: the hot spot inside a slow stage (the time of
the samples that fall in the stage's time windows), whether the event loop's own thread was running code or
waiting (samples of that thread), and whether the GIL is held by Python code (how late the
sampler itself wakes up: a thread that only wants the GIL gets it late when other threads
are busy in Python, on time when they run native code that releases it).
"""

from __future__ import annotations

import bisect
import contextlib
import linecache
import os
import random
import statistics
import sys
import threading
import time
from typing import Any, Iterator

from .evidence import LoopActivity

__all__ = ["CALLED_FROM", "StackSampler", "user_place"]

#: between a library's line and the user's line that called it, in a hot spot
CALLED_FROM = ", called from "


def user_place(entry: str) -> str:
    """The ``file:line`` a user can change in one hot-spot entry: the user's line that called
    the library code it is in, else its own frame's."""
    return entry.split(" (")[0].split(CALLED_FROM)[-1].split(" ", 1)[0]


def _place(short: str, frame: Any) -> str:
    """``file:line function``; a frame between lines (``f_lineno`` None: an instruction with no
    line of its own, as Python 3.11 has) is put on its function's first line."""
    line = frame.f_lineno
    return f"{short}:{line if line is not None else frame.f_code.co_firstlineno} {frame.f_code.co_name}"


class StackSampler:
    """Every ``interval`` it notes, for each thread, the innermost frame outside servescope
    and the threading machinery (``None`` when the thread is waiting: in a selector, a queue,
    a lock, a socket), with a timestamp, so samples can be attributed to time windows."""

    # (runpy: the bottom of a main thread lent to the app's server, idle in servescope's own frames)
    _SKIP = ("servescope" + os.sep, os.sep + "threading.py", os.sep + "concurrent" + os.sep, os.sep + "selectors.py", "<frozen runpy>", os.sep + "runpy.py")
    _IDLE = ("queue.py", "socket.py", "selectors.py", "threading.py", "base_events.py", "runners.py", "ssl.py", "socketserver.py")
    #: waits that block the thread they are on (a queue, a lock, a socket read): on an event
    #: loop's own thread these stop the loop, where its selector's wait does not
    _BLOCKING = ("queue.py", "threading.py", "socket.py", "ssl.py")
    #: the standard library's calls that wait only for another thread to take the GIL:
    #: ``Thread.start`` until the new thread runs, a queue's ``put_nowait``/``get_nowait`` for
    #: its lock. A framework that hands a ``def`` route to its pool (anyio, ``run_in_executor``)
    #: makes them on the loop's thread; while the pool's threads hold the GIL they wait, and that
    #: is the GIL's contention (its own rule), not code that blocks the loop with a fix of its own
    _HANDOFFS = frozenset({"start", "put_nowait", "get_nowait"})

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        #: (time ns, thread id, where or None when waiting, the time since the sweep before, ns):
        #: the sampler needs the GIL to look, so while pure-Python code holds it a sweep comes
        #: late and stands for all the time since the last one; hot spots count that time, not
        #: samples (a C call that releases the GIL would otherwise be seen more often than a
        #: Python loop that runs longer)
        self.samples: list[tuple[int, int, str | None, int]] = []
        #: (time ns, thread id, the code that waits, the time since the sweep before, ns): watched
        #: threads sampled in a blocking wait (``_BLOCKING``), named by the first frame outside it
        self.waits: list[tuple[int, int, str, int]] = []
        #: the threads whose blocking waits are recorded (an event loop's: a pool's idle
        #: workers wait in a queue all the time, and naming each wait costs a stack walk)
        self.watch: set[int] = set()
        #: (time ns, how late the sampler woke, ms)
        self.lateness: list[tuple[int, float]] = []
        self._names: dict[str, str] = {}
        self._codes: dict[int, tuple[Any, tuple[bool, str, bool]]] = {}
        #: short names of the files sampled that are the user's own (not under site-packages or the stdlib)
        self.user_files: set[str] = set()
        self._user_paths: dict[str, str] = {}
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while ``paused``
        self._running.set()
        self._thread = threading.Thread(target=self._run, daemon=True, name="servescope-sampler")

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(1)

    #: the GIL's switch interval while lines are sampled (see ``precise_lines``)
    PRECISE_SWITCH_S = 0.0005

    @contextlib.contextmanager
    def precise_lines(self) -> Iterator[None]:
        """Samples that land on the line that took the time, for the sequential requests. A C
        call that holds the GIL (``list(img.getdata())``) keeps the sampler waiting; with
        Python's switch interval (5 ms) the waiting sampler asks for the GIL only 5 ms on, by
        when a call shorter than that has returned and the thread is on a later line, which
        gets the time. With a shorter interval the sampler asks while the call still runs and
        gets the GIL as it returns, on its own line (a 3.4 ms call: 5% of its time on its line
        at 5 ms, 90% at 0.5 ms). Only while one request runs at a time: under concurrent
        requests the interval would change how their threads take turns on the GIL, which the
        doctor measures there. Restored after."""
        before = sys.getswitchinterval()
        sys.setswitchinterval(min(before, self.PRECISE_SWITCH_S))
        try:
            yield
        finally:
            sys.setswitchinterval(before)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No samples while the doctor times fixes: a sweep takes the GIL every ``interval``,
        which slows Python-heavy work (unpickling a model) by a share the endpoint's own
        process would not pay, and that share would count in the saving too. The time paused
        is no sweep's: the first one after it stands for one interval."""
        self._running.clear()
        try:
            yield
        finally:
            self._running.set()

    def _run(self) -> None:
        me = threading.get_ident()
        interval_ns = int(self.interval * 1e9)
        last = time.perf_counter_ns()
        while True:
            if not self._running.is_set():
                while not self._running.wait(0.05):
                    if self._stop.is_set():
                        return
                last = time.perf_counter_ns()
            asked = time.perf_counter_ns()
            # a period drawn afresh each time (0.5-1.5x): at a fixed one, a sweep that lands as
            # the worker lets the GIL go anchors the next one there, and code that loops in step
            # with it (a C call of 2 ms, then a release) is sampled at that one point every time
            wait_ns = int(interval_ns * (0.5 + random.random()))
            if self._stop.wait(wait_ns / 1e9):
                return
            now = time.perf_counter_ns()
            self.lateness.append((now, max(0, now - asked - wait_ns) / 1e6))
            dt = min(now - last, 50 * interval_ns)  # (capped: a sampler stopped for long says little of that time)
            last = now
            for tid, frame in sys._current_frames().items():
                if tid != me:
                    where = self._where(frame)
                    self.samples.append((now, tid, where, dt))
                    if where is None and tid in self.watch and frame.f_code.co_filename.endswith(self._BLOCKING):
                        waiter = self._waiter(frame)
                        if waiter is not None:
                            self.waits.append((now, tid, waiter, dt))

    def _code(self, code: Any) -> tuple[bool, str, bool]:
        """(servescope's or the threading machinery's, the file's short name, the user's own):
        per code object, once (a sweep walks every working thread's stack)."""
        seen = self._codes.get(id(code))  # (by id: a code object's own hash reads its bytecode)
        if seen is not None and seen[0] is code:
            return seen[1]
        name = code.co_filename
        skipped = any(part in name for part in self._SKIP)
        short = self._short(name)
        info = (skipped, short, not skipped and short in self.user_files)
        self._codes[id(code)] = (code, info)
        return info

    def _where(self, frame: Any) -> str | None:
        if frame.f_code.co_filename.endswith(self._IDLE):  # a thread waiting, not working
            return None
        f = frame
        while f is not None:
            skipped, short, user = self._code(f.f_code)
            if not skipped:
                where = _place(short, f)
                caller = None if user else self._callers_line(f.f_back)
                return where if caller is None else f"{where}{CALLED_FROM}{caller}"
            f = f.f_back
        return None

    #: how far down a library's stack the sampler looks for the user's line that called it
    #: (a transformers model's forward is some 40 frames below the handler's ``model(**inputs)``)
    CALLER_DEPTH = 64

    def _callers_line(self, f: Any) -> str | None:
        """The user's own line that called the library code a thread is in (``f``: the frame
        below it), None when no user frame is below: the line a user can change.
        ``collections/__init__.py:690 update`` alone does not say which ``Counter`` it is."""
        depth = 0
        while f is not None and depth < self.CALLER_DEPTH:
            _, short, user = self._code(f.f_code)
            if user:
                return _place(short, f)
            f, depth = f.f_back, depth + 1
        return None

    def _waiter(self, frame: Any) -> str | None:
        """The code that waits: the first frame below the standard library's waiting calls,
        and the user's own line that called it when that is further down. ``None`` for a
        hand-off to another thread (``_HANDOFFS``), which waits only for that thread's turn on
        the GIL."""
        f = frame
        while f is not None and (f.f_code.co_filename.endswith(self._BLOCKING) or any(p in f.f_code.co_filename for p in self._SKIP)):
            if (f.f_code.co_filename.endswith(("threading.py", "queue.py")) and f.f_code.co_name in self._HANDOFFS):
                return None
            f = f.f_back
        f = f or frame
        _, short, user = self._code(f.f_code)
        where = _place(short, f)
        caller = None if user else self._callers_line(f.f_back)
        return where if caller is None else f"{caller} (in {where})"

    _LIB_DIRS = tuple(
        sorted({os.path.join(p, "") for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
               | {os.path.join(os.path.dirname(os.__file__), "")}, key=len, reverse=True)
    )  # fmt: skip

    def _short(self, name: str) -> str:
        """A library's file from its package down (``torch/nn/modules/linear.py``, so the
        package is named); the user's own file by its folder and name."""
        short = self._names.get(name)
        if short is None:
            lib = next((d for d in self._LIB_DIRS if name.startswith(d)), None)
            short = name[len(lib):] if lib else os.sep.join(name.split(os.sep)[-2:])
            self._names[name] = short
            if lib is None and not name.startswith("<"):
                self.user_files.add(short)
                self._user_paths[short] = name
        return short

    def is_user_code(self, hot_spot: str) -> bool:
        """Whether the top frame of a hot spot is in the user's own files (not a library's)."""
        return hot_spot.split(":", 1)[0] in self.user_files

    def line_of(self, hot_spot: str) -> str | None:
        """The source text of a hot spot's top line when it is the user's own (``x = np.array(list(img.getdata()))``),
        or of the user's line that called the library code it is in."""
        short, _, line = user_place(hot_spot.split(";", 1)[0]).rpartition(":")
        path = self._user_paths.get(short)
        if path is None or not line.isdigit():
            return None
        return linecache.getline(path, int(line)).strip() or None

    def own_lines(self, hot_spot: str) -> dict[str, str]:
        """Each of a hot spot's places (``; ``-separated) that is the user's own line, or the
        user's line that called the library code it is in: ``file:line`` -> its source text."""
        out = {}
        for entry in hot_spot.split("; "):
            line = self.line_of(entry)
            if line is not None:
                out[user_place(entry)] = line
        return out

    @staticmethod
    def _top(counts: dict[str, int], n: int, top: int, samples: int | None = None) -> str:
        """The ``top`` frames by their time (``counts``: ns, of ``n`` in all) and, said beside,
        the samples they come from."""
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return "; ".join(f"{w} ({c * 100 // n}% of the time, {samples or n} samples)" for w, c in best)

    def _inside(self, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int, str | None, int]]:
        """The samples whose time falls in one of ``spans`` (time windows, ns)."""
        spans = sorted(spans)
        starts = [lo for lo, _ in spans]
        for sample in self.samples if spans else ():
            i = bisect.bisect_right(starts, sample[0]) - 1
            if i >= 0 and sample[0] <= spans[i][1]:
                yield sample

    def hot_spots(self, windows: dict[str, list[tuple[int, int]]], top: int = 2) -> dict[str, str]:
        """Per stage: the top frames among the working samples inside its windows."""
        out = {}
        for stage_name, spans in windows.items():
            counts: dict[str, int] = {}
            n = total = 0
            for _, _, where, dt in self._inside(spans):
                if where is not None:
                    counts[where] = counts.get(where, 0) + dt
                    total += dt
                    n += 1
            if n:
                out[stage_name] = self._top(counts, total, top, n)
        return out

    def working_share(self, spans: list[tuple[int, int]]) -> float | None:
        """Of the sweeps that landed in ``spans``, the share that found the busiest thread
        running code (not waiting on a socket, a queue or a lock): a hot spot read from windows
        spent mostly waiting names the little that ran, not where the time went. Counted per
        thread (the pool's idle threads wait all along), by sweeps (a late sweep's time may
        fall outside the window). None with fewer than 3 sweeps on any thread."""
        seen: dict[int, list[int]] = {}
        for _, tid, where, _ in self._inside(spans):
            c = seen.setdefault(tid, [0, 0])
            c[0] += where is not None
            c[1] += 1
        shares = [w / n for w, n in seen.values() if n >= 3]
        return max(shares) if shares else None

    def loop_activity(self, tid: int, start_ns: int, end_ns: int) -> LoopActivity:
        """How the event loop's thread spent ``[start_ns, end_ns]``."""
        mine = [(t, w, dt) for t, tt, w, dt in self.samples if tt == tid and start_ns <= t <= end_ns]
        busy = [(t, w, dt) for t, w, dt in mine if w is not None]
        longest, run_start = 0.0, None
        for t, w, _ in mine:
            if w is None:
                run_start = None
                continue
            if run_start is None:
                run_start = t
            longest = max(longest, (t - run_start) / 1e6 + self.interval * 1000)
        counts: dict[str, int] = {}
        for _, w, dt in busy:
            counts[w] = counts.get(w, 0) + dt  # type: ignore[index]
        waits = {t: w for t, tt, w, _ in self.waits if tt == tid and start_ns <= t <= end_ns}
        longest_wait, run_start, waited = 0.0, None, {}
        for t, _, dt in mine:  # runs of consecutive samples in a blocking wait
            if t not in waits:
                run_start = None
                continue
            waited[waits[t]] = waited.get(waits[t], 0) + dt
            run_start = t if run_start is None else run_start
            longest_wait = max(longest_wait, (t - run_start) / 1e6 + self.interval * 1000)
        return LoopActivity(
            samples=len(mine),
            busy_samples=len(busy),
            busy_share=round(len(busy) / len(mine), 3) if mine else 0.0,
            longest_busy_ms=round(longest, 2),
            hot_spot=self._top(counts, sum(counts.values()), 2, len(busy)) if busy else "",
            waiting_share=round(len(waits) / len(mine), 3) if mine else 0.0,
            longest_wait_ms=round(longest_wait, 2),
            waiting_in=self._top(waited, sum(waited.values()), 2, len(waits)) if waits else "",
        )

    def threads_hot_spot(self, start_ns: int, end_ns: int, exclude: set[int], top: int = 2) -> str:
        """The top frames of the working samples of every thread not in ``exclude``."""
        counts: dict[str, int] = {}
        n = total = 0
        for t, tid, where, dt in self.samples:
            if where is not None and tid not in exclude and start_ns <= t <= end_ns:
                counts[where] = counts.get(where, 0) + dt
                total += dt
                n += 1
        return self._top(counts, total, top, n) if n else ""

    def gil_wait_p50_ms(self, start_ns: int, end_ns: int) -> float | None:
        """The median of how late the sampler woke in the window: the time a thread that
        only wants the GIL waits for it."""
        late = [ms for t, ms in self.lateness if start_ns <= t <= end_ns]
        return round(statistics.median(late), 3) if late else None
