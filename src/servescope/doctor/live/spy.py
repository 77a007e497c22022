"""py-spy, the sampler ``doctor --pid`` runs beside a live process: it reads the target's
memory from outside (ptrace's ``process_vm_readv``), injects nothing and, with
``--nonblocking``, never pauses it. Here: the checks that refuse with one line, and a
recording of every thread's stacks as Chrome trace events (timestamps, so a run of frames can
be timed, not only counted)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from ...exceptions import EndpointError

__all__ = ["AttachError", "Recording", "check_target", "py_spy", "worker_pids"]

#: Samples per second by default: py-spy's own default, cheap enough for a live server
#: (bench/live_overhead.py measures what it costs the target).
RATE = 100


#: py-spy's errors without a Rust backtrace under them
_QUIET = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}


class AttachError(EndpointError):
    """The doctor cannot sample the process: not there, not Python, or not allowed. The
    message says what and how to allow it; the target was not touched."""


def py_spy() -> str:
    """The py-spy binary: beside this Python (the ``live`` extra installs it there), or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise AttachError("doctor --pid samples the process with py-spy, which is not installed: pip install 'servescope[live]'")
    return found


def _why_not(pid: int, stderr: str) -> str:
    text = stderr.strip().splitlines()
    said = next((line for line in text if "Error" in line or "error" in line), text[-1] if text else "no output")
    low = stderr.lower()
    if not Path(f"/proc/{pid}").exists() and sys.platform.startswith("linux"):
        return f"process {pid} does not exist (or it ended)"
    if "permission" in low or "operation not permitted" in low or "eperm" in low:
        return (
            f"not allowed to read process {pid}'s memory ({said.strip()}): run the doctor as the same user as the server "
            "with kernel.yama.ptrace_scope at 0 or 1 (`sysctl kernel.yama.ptrace_scope`), or as root; in a container, "
            "start it with --cap-add SYS_PTRACE"
        )
    if "python" in low and ("not" in low or "fail" in low or "couldn't" in low):
        return f"process {pid} does not look like a Python process to py-spy ({said.strip()}): give the PID of the Python server or of its master process"
    return f"py-spy could not attach to process {pid}: {said.strip()}"


#: A ``--nonblocking`` dump reads the stacks while the process runs, and fails with this when
#: they changed under it (a busy server): tried again, up to ``_DUMP_TRIES`` times in all.
_TORN = "Failed to get stack traces"
_DUMP_TRIES = 3


def check_target(pid: int, timeout_s: float = 15.0) -> int:
    """One stack dump (``py-spy dump --json``): proves the doctor may attach and that the
    process runs Python, before anything else happens. Returns its Python threads' count."""
    if pid <= 0:
        raise AttachError(f"--pid must be a process id, got {pid}")
    if pid == os.getpid():
        raise AttachError("--pid is the doctor's own process: give the server's")
    for attempt in range(_DUMP_TRIES):
        try:
            done = subprocess.run(
                [py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True, text=True, timeout=timeout_s, env=_QUIET
            )
        except subprocess.TimeoutExpired:
            raise AttachError(f"py-spy did not finish reading process {pid} within {timeout_s:g} s") from None
        if done.returncode == 0 or _TORN not in done.stderr + done.stdout or attempt == _DUMP_TRIES - 1:
            break
        time.sleep(0.2)  # a torn read: the process changed its stacks while py-spy read them
    if done.returncode != 0:
        raise AttachError(_why_not(pid, done.stderr + done.stdout))
    try:
        threads = orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        raise AttachError(f"py-spy's dump of process {pid} was not JSON: {done.stdout[:200]!r}") from None
    return len(threads)


def worker_pids(pid: int) -> list[int]:
    """The Python processes under ``pid`` (gunicorn/uvicorn workers), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return sorted(set(out))


class Recording:
    """``py-spy record`` over a live process and its children, in the background, until
    ``stop()``: every thread (idle ones too, so waits can be told from work), at ``rate``; with
    ``gil``, only the thread holding the GIL at each sample.

        rec = Recording(pid).start()
        ...                       # the phase to sample
        events = rec.stop()       # Chrome trace events: ph B/E, ts in microseconds, pid, tid
    """

    def __init__(self, pid: int, rate: int = RATE, *, subprocesses: bool = True, gil: bool = False) -> None:
        self.pid, self.rate, self.subprocesses, self.gil = pid, rate, subprocesses, gil
        self._dir = tempfile.mkdtemp(prefix="servescope-live-")
        self.path = Path(self._dir) / "trace.json"
        self._proc: subprocess.Popen[bytes] | None = None
        self.launched = 0.0  # perf_counter when py-spy was started

    def start(self) -> Recording:
        cmd = [py_spy(), "record", "--pid", str(self.pid), "--format", "chrometrace", "--output", str(self.path),
               "--rate", str(self.rate), "--gil" if self.gil else "--idle", "--threads", "--nonblocking", "--full-filenames"]  # fmt: skip
        if self.subprocesses:
            cmd.append("--subprocesses")
        self.launched = time.perf_counter()
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_QUIET)
        return self

    def offset_us(self, first: Recording) -> int:
        """Microseconds from ``first``'s start to this one's: its event times on ``first``'s clock."""
        return int((self.launched - first.launched) * 1e6)

    def stop(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Stop sampling (py-spy writes its file on SIGINT) and read the events."""
        proc = self._proc
        if proc is None:
            return []
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        try:
            data = self.path.read_bytes()
        except OSError:
            raise AttachError(_why_not(self.pid, err.decode(errors="replace"))) from None
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        events = orjson.loads(data) if data.strip() else []
        return events if isinstance(events, list) else events.get("traceEvents", [])

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None
