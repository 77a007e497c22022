"""The child side of ``isolate.py``: import the target, run the doctor, save the report.

    python -m servescope.doctor.child JOB.json STATUS_FD

Progress goes to STATUS_FD as JSON lines (the endpoint's own output goes to a log the
parent keeps); the process ends with ``os._exit`` so that no thread the endpoint left
behind, and no native library's exit handler, can hold it up or abort it.

The run goes on a thread of its own: the main thread imports the target and then serves the
app, as uvicorn and gunicorn's worker do (``endpoints/main_thread.py`` says why).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:  # the parent died: nobody will read the report
            os._exit(1)


def main(argv: list[str]) -> None:
    from .endpoints.main_thread import lend_main_thread

    job = json.loads(Path(argv[1]).read_text())
    status = os.fdopen(int(argv[2]), "w", buffering=1)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="servescope-parent-watch").start()
    lend_main_thread(lambda: _run(job, status))  # (_run ends the process)


def _run(job: dict[str, Any], status: Any) -> None:
    def say(**msg: Any) -> None:
        status.write(json.dumps(msg) + "\n")
        status.flush()

    code = 0
    try:
        import orjson

        from ..exceptions import ConfigError
        from ..loader import load_target
        from .endpoints.main_thread import call_on_main_thread
        from .run import DoctorOptions, diagnose

        options = DoctorOptions(**{**job["options"], "batch_probe": tuple(job["options"]["batch_probe"])})
        say(phase="start-up (importing the target)")
        try:
            t0 = time.perf_counter()
            obj = call_on_main_thread(load_target, job["spec"])
            import_s = time.perf_counter() - t0
            payload = orjson.loads(Path(job["payload"]).read_bytes()) if job["payload"] else None
            from .cold import repeat_first_request
            from .fresh import FreshTrials

            report = diagnose(
                obj, payload=payload, options=options, progress=lambda p, f: say(phase=p, frac=f), target_name=job["spec"],
                repeat_cold=lambda: repeat_first_request(job["spec"], job["payload"], options),
                try_environment=FreshTrials(job["spec"], job["payload"], options, import_s), import_s=import_s,
            )  # fmt: skip
        except ConfigError as exc:
            say(config_error=str(exc))
            code = 2
        else:
            report.save(job["out"])
            say(done=True)
    except BaseException as exc:  # noqa: B036 - whatever happens, the parent hears of it
        if isinstance(exc, SystemExit):
            say(endpoint_failed=f"the endpoint's code raised SystemExit({exc.code!r})")
        else:
            say(crash=f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
        code = 4
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
