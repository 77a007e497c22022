"""The app's life: loading and warm-up off the event loop (/health at once, /ready when warm),
the watchdog that acts on a batch that never returns (a new worker takes the queue, or the
process ends for its supervisor to restart), and shutdown after the queued work. The
``Lifecycle`` methods are ``ServeApp``'s (app.py), which holds the runtime and the batcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any, Callable

from .asgi import Metrics
from .batching import Batcher, Item
from .limits import HttpLimits
from .model import Model
from .runtime import Runtime

__all__ = ["EXIT_STUCK", "MAX_REPLACEMENTS", "Lifecycle"]

log = logging.getLogger("servescope")

#: The exit status of a process the watchdog ends (``on_stuck="exit"``): a supervisor restarts it.
EXIT_STUCK = 70
#: Workers replaced (``on_stuck="replace"``) before the watchdog gives up and fails /ready for good:
#: each stuck thread holds what it held, and a model that hangs every worker will hang the next.
MAX_REPLACEMENTS = 3


class Lifecycle:
    """The methods of ``ServeApp`` that start it, watch its worker and stop it."""

    model: Model
    example: Any
    runtime: Runtime
    batcher: Batcher
    metrics: Metrics | None
    limits: HttpLimits
    state: str
    failure: str | None
    stuck: str | None
    on_stuck: str
    batch_timeout_s: float
    info: dict[str, Any]
    warmup_batch_sizes: list[int]
    inline_below_ns: int
    _lone_ns: int | None
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int | None
    _server: Any
    _ready: threading.Event
    _deliver: Callable[[list[Item]], None]
    _on_stream: Callable[[list[Item]], None]

    async def startup(self) -> None:
        """Start loading in the background: /health answers at once, /ready when warm."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.runtime.on_batch_done = self._deliver  # type: ignore[attr-defined]
        self.runtime.on_stream = self._on_stream
        self.runtime.on_progress = self.batcher.progress
        if self.metrics is not None:  # items per forward (queue depth is read at scrape time)
            self.runtime.on_forward = self.metrics.batch_size.observe
        if self.state == "starting":  # not loaded beforehand with load_now()
            threading.Thread(target=self.load_now, name="servescope-load", daemon=True).start()

    def _threads_switched(self, before: int, after: int, why: str) -> None:
        """The tuner moved torch's threads: /info and /metrics say the count now, and why."""
        self.info.update(torch_threads=after, threads_from="adapted while serving", threads_why=why)
        if self.metrics is not None:
            self.metrics.threads.clear()
            self.metrics.threads.labels(source="adapted while serving").set(after)

    def load_now(self) -> str:
        """Load and warm up in this thread; returns the state ("ready" or "failed"). For hosts
        that decide readiness themselves (a Ray replica is routed to once its constructor ends)."""
        try:
            self.state = "loading"
            info = self.runtime.load()
            if self.metrics is not None and "torch_threads" in info:
                self.metrics.threads.labels(source=info["threads_from"]).set(info["torch_threads"])
            if self.metrics is not None:
                self.metrics.omp_wait.labels(policy=info["omp_wait_policy"], source=info["omp_wait_from"]).set(1)
            self.state = "warming up"
            t0 = time.perf_counter()
            if self.example is not None:
                info["warmup_batch_sizes"] = self.runtime.warm_up(self.example, self.warmup_batch_sizes)
            else:
                info["warmup_batch_sizes"] = []
                log.warning("servescope: no example payload: serving without warm-up (set Model.example)")
            info["warmup_s"] = round(time.perf_counter() - t0, 3)
            if self.example is not None:
                self._lone_ns = self._time_one(self.example)
                info["inline"] = self._lone_ns < self.inline_below_ns
            info["max_batch_size"] = self.batcher.max_batch_size
            self.info = info
            # from now on a stream advances a round at a time, between batches (warm-up ran each
            # to its end): a request that comes while others stream starts at once
            self.runtime.live = []
            self.batcher.advance = self.runtime.advance
            info["threads_adapt"] = self.runtime.adapt_threads(on_switch=self._threads_switched)
            info["lanes"], info["lanes_why"] = self.runtime.start_lanes()
            if self.metrics is not None:
                self.metrics.lanes.labels(why=info["lanes_why"]).set(info["lanes"])
            self.batcher.start()
            self.state = "ready"
            threading.Thread(target=self._watch, name="servescope-watchdog", daemon=True).start()
            log.info(
                "servescope: ready. model on %s, loaded in %.2f s, warmed up at batch sizes %s in %.2f s; "
                "%s; %s; max_batch_size %d; a lone request %s",
                info["device"], info["load_s"], info["warmup_batch_sizes"], info["warmup_s"], self._threads_words(info),
                f"forwards {info['lanes']} at a time when a batch has several ({info['lanes_why']})" if info["lanes"] > 1 else "one forward at a time",
                self.batcher.max_batch_size,
                "runs on the event loop (no thread hand-off)" if info.get("inline") else "goes through the worker",
            )  # fmt: skip
        except Exception as exc:
            self.state = "failed"
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error("servescope: start-up failed: %s", self.failure, exc_info=exc)
            if self._server is not None:  # run() owns the server: stop it
                self._server.should_exit = True
        finally:
            self._ready.set()
        return self.state

    def _threads_words(self, info: dict[str, Any]) -> str:
        """The start-up line's threads: torch's for a torch model, else the CPUs alone (torch's
        threads are not an ONNX Runtime or scikit-learn model's)."""
        if not info.get("uses_torch"):
            return f"{info['cpus_available']:g} CPUs (not a torch model: its library picks its own threads)"
        return (
            f"torch threads {info.get('torch_threads', '-')} of {info['cpus_available']:g} CPUs (from {info.get('threads_from', '-')}"
            f"{', adapted while serving' if info['threads_adapt'] else ''}), OpenMP's idle threads {self.runtime.wait.words}"
        )

    def _watch(self) -> None:
        """The watchdog's thread: a look at the running batch four times per ``batch_timeout_s``
        (at least every quarter second), for as long as the app serves."""
        interval = min(0.25, self.batch_timeout_s / 4)
        while self.state in ("ready", "stuck"):
            time.sleep(interval)
            self.check_stuck()

    def check_stuck(self, now_ns: int | None = None) -> bool:
        """Whether the running batch has outlived ``batch_timeout_s``; if so, act on it: a new
        worker takes the queue (``on_stuck="replace"``, up to ``MAX_REPLACEMENTS`` times, then
        /ready fails for good), or the process ends with ``EXIT_STUCK`` (``"exit"``)."""
        started = self.batcher.batch_started_ns
        if started is None or self.state != "ready":
            return False
        ran_s = ((self.batcher.clock() if now_ns is None else now_ns) - started) / 1e9
        if ran_s <= self.batch_timeout_s:
            return False
        self.stuck = f"a batch ran {ran_s:.1f} s, over batch_timeout_s={self.batch_timeout_s:g}: the model's code did not return"
        if self.on_stuck == "exit":
            self.state = "stuck"
            log.critical("servescope: %s; exiting with status %d so that the process supervisor restarts it", self.stuck, EXIT_STUCK)
            for handler in logging.getLogger().handlers + log.handlers:
                handler.flush()
            os._exit(EXIT_STUCK)
        if self.batcher.replacements >= MAX_REPLACEMENTS:
            self.state = "failed"
            self.failure = f"{self.stuck}; the worker got stuck {MAX_REPLACEMENTS + 1} times, so it is not replaced again"
            log.error("servescope: %s", self.failure)
            return True
        log.error(
            "servescope: %s; a new worker takes the queue (replacement %d of %d), the stuck thread is abandoned",
            self.stuck, self.batcher.replacements + 1, MAX_REPLACEMENTS,
        )  # fmt: skip
        self.batcher.replace_worker()
        if self.metrics is not None:
            self.metrics.replacements.inc()
        return True

    def _time_one(self, example: Any, runs: int = 3) -> int:
        """A lone item's time through the runtime (the best of ``runs``), in ns."""
        value = self.model.validate(example)
        best = None
        for _ in range(runs):
            t = time.perf_counter_ns()
            self.runtime.process([Item(value)])
            took = time.perf_counter_ns() - t
            best = took if best is None else min(best, took)
        return best or 0

    def wait_started(self, timeout: float | None = None) -> str:
        """Block until start-up has finished (or ``timeout`` s); returns the state."""
        self._ready.wait(timeout)
        return self.state

    async def wait_ready(self, timeout: float = 60.0) -> str:
        """Wait until start-up has finished (ready or failed); returns the state."""
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait, timeout)
        return self.state

    async def shutdown(self) -> None:
        """Finish queued work, then stop the worker."""
        if self.state != "failed":  # a failed start-up stays failed: run() reports it
            self.state = "stopping"
        await asyncio.get_running_loop().run_in_executor(None, self.batcher.stop)

    def run(self, host: str = "127.0.0.1", port: int = 8000, **uvicorn_options: Any) -> str:
        """Serve on uvicorn with this app's HTTP limits (head size and deadline, connections)
        until SIGINT/SIGTERM, which finish in-flight requests first, or until loading or
        warm-up fails (the server stops: nothing is served by a process that cannot serve).
        Returns the final state: "stopping", or "failed" with the reason in ``failure``.
        ``uvicorn module:app`` serves the app too, with the body limits and deadlines but
        uvicorn's own head handling, and a failed start-up answering 503 on /ready."""
        import uvicorn

        options = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": 30, **self.limits.uvicorn_options()}
        server = uvicorn.Server(uvicorn.Config(self, host=host, port=port, **{**options, **uvicorn_options}))
        self._server = server
        server.run()
        return self.state
