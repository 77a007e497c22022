"""Several worker processes behind one port: ``servescope serve file.py:Model --workers N``.

Each worker is a process of its own (its model, batcher and threads: the CPUs divided by N,
so N workers never oversubscribe them), all accepting on one listening socket (uvicorn's
supervisor, which also starts a worker again when one dies). One ``/report`` and one
``/metrics`` cover them all: each worker writes a snapshot of its figures (distributions,
never percentiles) to a shared folder every ``report_interval_s`` (1 s), and whichever worker
answers merges its own live figures with the others' latest snapshots. Every response names
its worker in ``Server-Timing`` (``replica;desc="w<pid>"``), so ``servescope bench`` counts
the answers per worker.

This is the fix for GIL-bound endpoints (the doctor's ``gil-contention``): the workers' Python
runs in parallel.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..environment import available_cpus
from ..exceptions import ConfigError
from ..report import Report
from . import model_of
from .app import ServeApp
from .limits import ENV_HEADER_BYTES, ENV_HEADER_TIMEOUT, HttpLimits, limited_httptools

__all__ = ["run_workers", "worker_app"]

log = logging.getLogger("servescope")

#: What the supervisor tells its workers (the command line's edge: environment variables).
ENV_TARGET, ENV_OPTIONS, ENV_DIR = "SERVESCOPE_WORKER_TARGET", "SERVESCOPE_WORKER_OPTIONS", "SERVESCOPE_WORKER_DIR"
#: A snapshot older than this is of a worker that stopped writing (stuck or gone): left out.
STALE_S = 30.0
_LIMIT_OPTIONS = ("max_header_bytes", "header_timeout_s", "max_connections")
#: The file a worker whose start-up failed writes its reason to, in the shared folder.
FAILED = "failed"


def run_workers(target: str, workers: int, *, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> str | None:
    """Serve ``target`` (a ``Model`` subclass, as ``path/to/file.py:Name``) from ``workers``
    processes on one port, until SIGINT/SIGTERM, or until a worker's loading or warm-up fails:
    then every worker is stopped and the failure is returned (None after a signal)."""
    import uvicorn

    if not isinstance(workers, int) or workers < 2:
        raise ConfigError(f"workers must be a whole number >= 2 (one worker: no --workers), got {workers!r}")
    limits = HttpLimits(**{k: options.pop(k) for k in _LIMIT_OPTIONS if k in options})
    options.setdefault("threads", max(1, int(available_cpus() // workers)))
    with tempfile.TemporaryDirectory(prefix="servescope-workers-") as shared:
        os.environ.update(
            {
                ENV_TARGET: target,
                ENV_OPTIONS: json.dumps(options),
                ENV_DIR: shared,
                ENV_HEADER_BYTES: str(limits.max_header_bytes),
                ENV_HEADER_TIMEOUT: str(limits.header_timeout_s),
            }
        )
        protocol = {"http": "servescope.serve.limits:LimitedHttpTools"} if limited_httptools(limits) is not None else {}
        failed = Path(shared) / FAILED
        stop = threading.Event()
        threading.Thread(target=_stop_on_failure, args=(failed, stop), name="servescope-failures", daemon=True).start()
        uvicorn.run(
            "servescope.serve.workers:worker_app", factory=True, workers=workers, host=host, port=port,
            limit_concurrency=limits.max_connections, h11_max_incomplete_event_size=limits.max_header_bytes,
            log_level="warning", access_log=False, timeout_graceful_shutdown=30, **protocol,
        )  # fmt: skip
        stop.set()
        try:
            return failed.read_text() or "a worker failed to start"
        except OSError:
            return None


def _stop_on_failure(failed: Path, stop: threading.Event) -> None:
    """The supervisor's watch: a worker that could not load or warm up writes ``failed``; then
    the supervisor stops (SIGTERM to itself: uvicorn stops every worker), rather than serve 503
    for ever from a model that cannot start (the other workers would fail the same way)."""
    import signal

    while not stop.wait(0.2):
        if failed.exists():
            os.kill(os.getpid(), signal.SIGTERM)
            return


def worker_app() -> ServeApp:
    """The app of one worker (uvicorn calls this in each worker process)."""
    from ..loader import load_target

    target, shared = os.environ[ENV_TARGET], Path(os.environ[ENV_DIR])
    options = json.loads(os.environ[ENV_OPTIONS])
    obj = load_target(target)
    model = model_of(obj)
    if model is None:
        raise ConfigError(f"--workers builds one app per worker from a servescope.Model: {target} is {type(obj).__name__}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("servescope").setLevel(logging.INFO)
    name = f"w{os.getpid()}"
    mine = shared / f"worker-{os.getpid()}.json"
    app: ServeApp | None = None

    def merged() -> Report:
        assert app is not None
        return combined(app.recorder.report(tool="servescope serve"), shared, exclude=mine)

    app = ServeApp(model, report_source=merged, merged_metrics=True, timing_suffix=f', replica;desc="{name}"', **options)
    threading.Thread(target=_snapshots, args=(app, mine), name="servescope-snapshots", daemon=True).start()
    threading.Thread(target=_say_failure, args=(app, shared / FAILED), name="servescope-start", daemon=True).start()
    return app


def _say_failure(app: ServeApp, failed: Path) -> None:
    """Tell the supervisor when this worker's start-up failed (the reason, for its exit)."""
    if app.wait_started() == "failed":
        tmp = failed.with_name(f"{FAILED}.{os.getpid()}")
        tmp.write_text(f"{app.failure}")
        tmp.replace(failed)


def combined(own: Report, shared: Path, *, exclude: Path) -> Report:
    """This worker's figures merged with every other worker's latest snapshot."""
    reports = [own]
    now = time.time()
    for path in sorted(shared.glob("worker-*.json")):
        if path == exclude:
            continue
        try:
            if now - path.stat().st_mtime > STALE_S:
                continue
            reports.append(Report.load(path))
        except (OSError, ValueError) as exc:  # a worker replacing its file right now: next time
            log.debug("servescope: snapshot %s unreadable: %s", path, exc)
    if len(reports) == 1:
        return own
    merged = Report.combine(reports, tool="servescope serve")
    merged.meta["workers"] = len(reports)
    return merged


def _snapshots(app: ServeApp, path: Path) -> None:
    """Write this worker's figures for the others, every ``report_interval_s``, while it serves."""
    interval = max(app.report_interval_s, 0.2)
    tmp = path.with_name(path.name + ".tmp")
    while app.state not in ("stopping", "failed"):
        time.sleep(interval)
        try:
            tmp.write_text(app.recorder.report(tool="servescope serve").to_json(indent=False, samples=False))
            tmp.replace(path)  # atomically: a reader never sees half a file
        except OSError as exc:
            log.warning("servescope: cannot write this worker's snapshot %s: %s", path, exc)
    path.unlink(missing_ok=True)
