"""Sampling beside the load: the server's Prometheus metrics (``bench --scrape``) and this
machine's GPUs (NVML), in a thread of their own, over each level's measured window.

    sampler = Sampler(scrape="http://127.0.0.1:8000/metrics", interval_s=1.0)
    sampler.open()                            # one scrape now: ConfigError if it fails, before any load
    sampler.start(from_ns, until_ns)          # samples at from_ns, every interval, and at until_ns
    ...                                       # the level's load
    metrics, gpu = sampler.stop()             # load.server_metrics, load.gpu
    sampler.close()

The thread only fetches during the window (an HTTP GET with a short timeout, an NVML read):
the texts are parsed after it, so the load generator's event loop shares the interpreter with
nothing but a blocked socket read (past ``PARSE_AFTER_BYTES`` kept, the thread parses as it goes).
Times are ``time.perf_counter_ns``, the load generator's clock.
"""

from __future__ import annotations

import http.client
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from ..exceptions import ConfigError, require
from .telemetry import Gpu, GpuDevice, MetricsWindow, Range, ServerMetrics
from .wire import URL

__all__ = ["MAX_BODY", "Nvml", "Sampler", "http_get"]

#: A /metrics answer over this is a failed scrape (a real one is well under 1 MiB).
MAX_BODY = 32 * 2**20
#: Scrapes kept unparsed during the window up to this many bytes; past it they are parsed in the thread.
PARSE_AFTER_BYTES = 16 * 2**20
#: The scrape before the load waits this long at most.
CHECK_TIMEOUT_S = 5.0
#: Shortest interval between samples.
MIN_INTERVAL_S = 0.1

# not through a proxy: the load generator does not use one either
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float) -> bytes:
    """The body of a GET (``urllib``'s errors for anything but a 2xx answer)."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "servescope-bench"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        body: bytes = response.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError(f"answer over {MAX_BODY // 2**20} MiB")
    return body


def _why(exc: BaseException, timeout_s: float) -> str:
    """A failed scrape in a few words."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason: Any = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout_s:g}s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError):
        return reason.strerror or type(reason).__name__
    if isinstance(reason, http.client.HTTPException):
        return f"not an HTTP answer ({type(reason).__name__})"
    text = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
    return text[:200]


class Nvml:
    """This machine's GPUs through NVML (``pynvml``, from nvidia-ml-py).

    ``Nvml.open()`` returns a reader, or None and why there is none: nvidia-ml-py not
    installed, NVML not starting (no driver), or no GPU. ``nvml`` may be a stand-in module."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml, self.handles = nvml, handles
        self.names = [_text(self._try(nvml.nvmlDeviceGetName, h)) or f"GPU {i}" for i, h in enumerate(handles)]
        self.uuids = [_text(self._try(nvml.nvmlDeviceGetUUID, h)) for h in handles]
        self.driver = _text(self._try(nvml.nvmlSystemGetDriverVersion))

    @classmethod
    def open(cls, nvml: Any = None) -> tuple[Nvml | None, str]:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return None, "none seen: nvidia-ml-py is not installed (pip install 'servescope[gpu]')"
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError (no driver, no library): no GPU to sample, not an error
            return None, f"none seen: NVML did not start ({_message(exc)})"
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:
            nvml.nvmlShutdown()
            return None, f"none seen: NVML could not list the GPUs ({_message(exc)})"
        if not handles:
            nvml.nvmlShutdown()
            return None, "none seen: NVML found no GPU"
        return cls(nvml, handles), ""

    @staticmethod
    def _try(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:
            return None

    def read(self) -> list[tuple[float | None, float | None, float | None, float | None, str | None]]:
        """Each GPU's utilization %, memory utilization %, memory used and total (bytes), and
        why a reading failed (a device gone; a MIG slice does not say its utilization)."""
        out = []
        for handle in self.handles:
            util = memory = None
            errors = []
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            except Exception as exc:
                errors.append(f"utilization: {_message(exc)}")
            try:
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                errors.append(f"memory: {_message(exc)}")
            out.append((
                None if util is None else float(util.gpu), None if util is None else float(util.memory),
                None if memory is None else float(memory.used), None if memory is None else float(memory.total),
                "; ".join(errors) or None,
            ))  # fmt: skip
        return out

    def close(self) -> None:
        self._try(self.nvml.nvmlShutdown)


def _text(value: Any) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _message(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


class _Span:
    """Smallest, largest and mean of the values seen."""

    def __init__(self) -> None:
        self.lo, self.hi, self.total, self.n = math.inf, -math.inf, 0.0, 0

    def add(self, x: float | None) -> None:
        if x is not None and math.isfinite(x):
            self.lo, self.hi, self.total, self.n = min(self.lo, x), max(self.hi, x), self.total + x, self.n + 1

    def range(self, digits: int = 1) -> Range | None:
        return Range(min=round(self.lo, digits), mean=round(self.total / self.n, digits), max=round(self.hi, digits)) if self.n else None


class Sampler:
    """Samples ``scrape`` (a Prometheus endpoint) and, with ``gpu``, this machine's GPUs every
    ``interval_s`` over a window, in its own thread. ``fetch(url, timeout_s) -> bytes``, ``nvml``
    (a stand-in for ``pynvml``) and ``clock`` (ns) are for tests."""

    def __init__(
        self,
        *,
        scrape: str | None = None,
        interval_s: float = 1.0,
        gpu: bool = True,
        fetch: Callable[[str, float], bytes] = http_get,
        nvml: Any = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if not isinstance(interval_s, (int, float)) or not interval_s >= MIN_INTERVAL_S or math.isinf(interval_s):
            raise ConfigError(f"the sampling interval (--scrape-interval) must be at least {MIN_INTERVAL_S * 1000:g}ms, got {interval_s!r}s")
        if scrape is not None:
            try:
                URL.parse(scrape)
            except ConfigError as exc:
                raise ConfigError(f"--scrape: {exc}") from None
            require("prometheus_client", "prometheus", "bench --scrape reads the server's metrics with it.")
        self.scrape, self.interval_s, self.gpu = scrape, float(interval_s), gpu
        #: one scrape may take this long; a slower one is a failed scrape
        self.timeout_s = min(max(2.0, 2 * self.interval_s), 10.0)
        self._fetch, self._nvml_module, self._clock = fetch, nvml, clock
        self.nvml: Nvml | None = None
        #: what the report's meta says when no GPU is sampled ("" when one is, or with gpu=False)
        self.gpu_note = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the window's state: the thread's samples, and stop's summary
        self._window_id = 0  # a thread records into its own window only (one stuck past its timeout: none)

    def __repr__(self) -> str:
        return f"Sampler(scrape={self.scrape!r}, interval_s={self.interval_s}, gpu={self.gpu})"

    @property
    def active(self) -> bool:
        """Whether there is anything to sample (a scrape URL, or a GPU that NVML sees)."""
        return self.scrape is not None or self.nvml is not None

    def open(self) -> None:
        """Scrape once (``ConfigError`` when that fails: before any request is sent) and open NVML."""
        if self.scrape is not None:
            t = CHECK_TIMEOUT_S
            try:
                text = self._fetch(self.scrape, t).decode("utf-8", errors="replace")
            except (OSError, ValueError, http.client.HTTPException) as exc:  # urllib's errors, an answer too large
                raise ConfigError(f"--scrape {self.scrape}: the metrics could not be read ({_why(exc, t)}), so no request was sent") from None
            try:
                if not text.strip():
                    raise ValueError("an empty answer")
                MetricsWindow().add(0, text)
            except ValueError as exc:
                raise ConfigError(
                    f"--scrape {self.scrape}: not Prometheus metrics ({_message(exc)}), so no request was sent: give the "
                    "server's metrics URL, e.g. http://HOST:PORT/metrics"
                ) from None
        if self.gpu:
            self.nvml, self.gpu_note = Nvml.open(self._nvml_module)

    def close(self) -> None:
        self._halt()
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None

    def start(self, from_ns: int, until_ns: int | None = None) -> None:
        """Sample from ``from_ns`` (the measured window's start) every interval until ``until_ns``
        (its planned end; None: until ``stop``), with a sample at each end."""
        self._halt()
        self._window, self._gpus = MetricsWindow(), [[_Span(), _Span(), _Span()] for _ in self._devices()]
        self._gpu_samples, self._gpu_failed, self._gpu_error = 0, 0, None
        self._pending: list[tuple[int, bytes]] = []
        self._pending_bytes = 0
        self._totals: list[float | None] = [None] * len(self._devices())
        self._ended = False
        self._window_id += 1
        if not self.active:
            return
        self._stop = threading.Event()
        args = (from_ns, until_ns, self._window_id, self._stop)
        self._thread = threading.Thread(target=self._run, args=args, name="servescope-sampler", daemon=True)
        self._thread.start()

    def end(self) -> None:
        """End the window now (Ctrl-C): the thread takes its last sample at once; ``stop``
        collects. Returns at once, from any thread."""
        self._stop.set()

    def stop(self) -> tuple[ServerMetrics | None, Gpu | None]:
        """End the window (a last sample now, unless its planned end passed) and summarise it."""
        if self._thread is None:
            return None, None
        self._halt()
        with self._lock:  # (a thread still in a fetch past its timeout records nothing after this)
            self._ended = True
            self._parse_pending()
            metrics = self._window.summary(url=self.scrape, interval_s=self.interval_s) if self.scrape is not None else None
            return metrics, self._gpu_section()

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(self.timeout_s + 5)
            self._thread = thread if thread.is_alive() else None  # (a fetch past its timeout: left to end)

    def _devices(self) -> list[int]:
        return list(range(len(self.nvml.handles))) if self.nvml is not None else []

    def _run(self, from_ns: int, until_ns: int | None, window: int, stop: threading.Event) -> None:
        interval_ns = round(self.interval_s * 1e9)

        def wait(t_ns: int) -> bool:  # until t_ns; True when told to stop first
            return stop.wait(max(0.0, (t_ns - self._clock()) / 1e9))

        if wait(from_ns):
            return  # stopped before the window opened: nothing to say of it
        self._sample(window)
        k = 1
        while True:
            now = self._clock()
            k = max(k, (now - from_ns) // interval_ns + 1)  # a slow sample skips the ticks it overran
            due = from_ns + k * interval_ns
            if until_ns is not None and due >= until_ns:
                wait(until_ns)
                self._sample(window)
                return
            if wait(due):
                self._sample(window)
                return
            self._sample(window)
            k += 1

    def _sample(self, window: int) -> None:
        if self.scrape is not None:
            t0 = self._clock()
            try:
                body: bytes | BaseException = self._fetch(self.scrape, self.timeout_s)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                body = exc
            t_ns = (t0 + self._clock()) // 2  # the server's moment: mid-request
            with self._lock:
                if self._ended or window != self._window_id:
                    return
                if isinstance(body, BaseException):
                    self._window.fail(_why(body, self.timeout_s), t_ns)
                else:
                    self._pending.append((t_ns, body))
                    self._pending_bytes += len(body)
                    if self._pending_bytes > PARSE_AFTER_BYTES:
                        self._parse_pending()
        if self.nvml is not None:
            readings = self.nvml.read()
            with self._lock:
                if not self._ended and window == self._window_id:
                    self._record_gpus(readings)

    def _record_gpus(self, readings: list[Any]) -> None:
        self._gpu_samples += 1
        for i, (util, mem, used, total, error) in enumerate(readings):
            if error is not None:
                self._gpu_failed += 1
                self._gpu_error = self._gpu_error or f"GPU {i}: {error}"
            for span, x in zip(self._gpus[i], (util, mem, used)):
                span.add(x)
            self._totals[i] = total if total is not None else self._totals[i]

    def _parse_pending(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for t_ns, body in pending:
            try:
                self._window.add(t_ns, body.decode("utf-8", errors="replace"))
            except ValueError as exc:
                self._window.fail(f"not Prometheus metrics ({_message(exc)})", t_ns)

    def _gpu_section(self) -> Gpu | None:
        if self.nvml is None:
            return None
        devices = [
            GpuDevice(
                index=i, name=self.nvml.names[i], uuid=self.nvml.uuids[i], samples=max(util.n, used.n),
                utilization_pct=util.range(), memory_utilization_pct=mem.range(), memory_used_bytes=used.range(0),
                memory_total_bytes=self._totals[i],
            )  # fmt: skip
            for i, (util, mem, used) in enumerate(self._gpus)
        ]
        return Gpu(
            host=socket.gethostname(), interval_s=self.interval_s, driver=self.nvml.driver, samples=self._gpu_samples,
            failed=self._gpu_failed, first_error=self._gpu_error, devices=devices,
        )  # fmt: skip
