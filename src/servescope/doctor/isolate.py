"""The command line's doctor run, isolated: the user's endpoint runs in a child process, in
its own process group, under a hard deadline, and the whole group is ended when the run
ends.

A handler that forks, starts threads that never end, deadlocks, calls ``sys.exit`` or
``os._exit``, or crashes the interpreter is the endpoint's failure: the parent reports it
(with the phase it happened in and the end of the endpoint's own output) and exits 3,
never hangs and never dies with it. Ctrl-C ends the run at once, children included.

Deadlines: each phase of the run is bounded inside the child by ``--timeout`` (a budget,
then the last request's whole timeout); the parent ends the child when it reports no
progress for two ``--timeout`` plus a margin (``START_S`` while it imports and starts), and in
any case after ``START_S`` + ``--timeout`` x ``PHASES`` + a margin, plus the experiments'
budget (``--experiments``) and the time a fresh process gets to repeat a slow first request.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..exceptions import ConfigError
from ..recorder import Recorder
from ..report import Report
from ..sections import Diagnosis, Verdict
from .run import MIN_OK_REQUESTS, DoctorOptions

__all__ = ["PHASES", "diagnose_isolated"]

#: Phases bounded by ``--timeout`` each: the cold request, the warm phase (its budget and
#: its last request), the probe check, the varied request, the concurrent phase (its budget
#: and its last requests), the same loads without the probes (one at a time, then concurrent:
#: the last request of each), the batch probe; plus MIN_OK_REQUESTS slow warm requests.
PHASES = 10 + MIN_OK_REQUESTS
MARGIN_S = 15.0
#: Importing the target and starting the app (torch, weights loaded at import) may take
#: longer than one request: at least this long, whatever ``--timeout`` says.
START_S = 120.0
_TAIL_LINES = 12


def _end_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 8192, 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-_TAIL_LINES:]


def _undiagnosed(reason: str, target_name: str, log: list[str]) -> Report:
    report = Recorder().report(title=f"servescope doctor {target_name}".strip(), tool="servescope doctor", target=target_name)
    report.meta["diagnosed"] = False
    report.diagnosis = Diagnosis(verdict=Verdict(diagnosed=False, reason=reason), endpoint_output=log)
    return report


def diagnose_isolated(
    spec: str,
    *,
    payload_path: str | None,
    options: DoctorOptions | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Report:
    """``diagnose(load_target(spec), ...)`` in a child process; see the module's docstring.
    Raises ``ConfigError`` for a target that cannot be imported or is not an endpoint."""
    options = options or DoctorOptions()
    tick = progress or (lambda phase, frac: None)
    with tempfile.TemporaryDirectory(prefix="servescope-doctor-") as tmp:
        out, log_path = Path(tmp) / "report.json", Path(tmp) / "endpoint.log"
        job = {"spec": spec, "payload": str(Path(payload_path).resolve()) if payload_path else None, "options": dataclasses.asdict(options), "out": str(out)}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        r, w = os.pipe()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "servescope.doctor.child", str(Path(tmp) / "job.json"), str(w)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                start_new_session=True,
            )
        os.close(w)
        previous = None
        if _in_main_thread():
            previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            result = _watch(proc, r, options, tick)
        finally:
            os.close(r)
            _end_group(proc.pid)
            proc.wait()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if "config_error" in result:
            raise ConfigError(result["config_error"])
        if result.get("done") and out.exists():
            return Report.load(out)
        log = _tail(log_path)
        phase = result.get("phase") or "start-up"
        if "late" in result:
            reason = f"the {phase} did not finish within {result['late']:g} s: the endpoint hangs, so the doctor ended it"
        elif "endpoint_failed" in result:
            reason = f"{result['endpoint_failed']} during the {phase}"
        elif "crash" in result:
            reason = f"servescope's doctor failed during the {phase}: {result['crash']}"
        elif proc.returncode is not None and proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            reason = f"the endpoint's process was killed by {name} during the {phase} (a crash in native code, or an abort)"
        else:
            reason = (
                f"the endpoint's process exited with status {proc.returncode} during the {phase}: "
                "the endpoint's own code ended it (sys.exit, os._exit)"
            )
        return _undiagnosed(reason, spec, log)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # ends the run the same way as Ctrl-C: the child's group goes too


def _watch(proc: subprocess.Popen[bytes], fd: int, options: DoctorOptions, tick: Callable[[str, float], None]) -> dict[str, Any]:
    """Read the child's progress until it is done, dies or overstays; what it said last."""
    start_s = max(options.timeout_s, START_S)
    # the experiments: their budget, the last block past it, and a fresh process for a slow first request
    hard_s = start_s + options.timeout_s * PHASES + MARGIN_S + options.experiment_seconds + 2 * options.timeout_s + START_S
    hard = time.monotonic() + hard_s
    last_word = time.monotonic()
    state: dict[str, Any] = {}
    buf = b""
    while True:
        now = time.monotonic()
        starting = str(state.get("phase", "start-up")).startswith("start-up")
        # a phase may run a budget plus a whole --timeout before it reports again
        quiet_for = (start_s if starting else 2 * options.timeout_s) + MARGIN_S
        if now > hard or now - last_word > quiet_for:
            state["late"] = round(now - last_word, 1) if now - last_word > quiet_for else round(hard_s, 1)
            return state
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if proc.poll() is not None:
                return state
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the child closed its end: it is done or dead
            proc.wait(timeout=max(min(hard - time.monotonic(), 5.0), 0.1))
            return state
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            last_word = time.monotonic()
            state.update(msg)
            if "phase" in msg:
                tick(msg["phase"], msg.get("frac", 0.0))
