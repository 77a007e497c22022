"""Starting and stopping the servers a benchmark compares (bench/serve_compare.py,
bench/serve_models.py): loopback only, each stopped with every process it started."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, body: bytes, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until a POST of ``body`` answers 200 (or the server exits, or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            if urllib.request.urlopen(req, timeout=5).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("not ready in time")


def proc_stats() -> Iterator[tuple[str, list[str]]]:
    """Each live process's PID and the fields of its /proc stat after its name (state ppid
    pgrp session ... utime stime at 11 and 12)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                yield entry, f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (gone meanwhile)


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) the live processes of process group ``pgid`` have used: a
    server started in a session of its own, with its workers."""
    ticks = sum(int(f[11]) + int(f[12]) for _, f in proc_stats() if int(f[2]) == pgid)
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a server started with ``start_new_session=True`` and every process it started (its
    session), by its PID: LitServe's workers outlive a plain terminate() and keep spinning."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived their parent
    except ProcessLookupError:
        pass


def run_alone(cmd: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own, as a user
    runs a command from a shell: the kernel shares the CPUs between sessions, so a command in the
    session of ``neighbour()`` (this script's) would get part of the neighbour's share. Past
    ``timeout`` the whole session is stopped (the doctor's child and fresh processes too)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def each_server(
    servers: dict[str, list[str]], url: str, ready_body: bytes, measure: Callable[[str, int], dict[str, Any]], *, cwd: Path, env: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Start each server alone (a session of its own), wait until it answers ``ready_body``,
    ``measure(name, pgid)`` (its process group: ``group_cpu_s``), stop it with everything it
    started; a server that cannot start is a row ``{"skipped": why}``, not a crash."""
    rows: dict[str, dict[str, Any]] = {}
    for name, cmd in servers.items():
        # a session of its own: LitServe's worker processes go with it (killpg), not on spinning
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_ready(url, ready_body, proc)
            rows[name] = measure(name, proc.pid)
        except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash
            rows[name] = {"skipped": str(exc)}
        finally:
            stop_group(proc)
            time.sleep(1)
    return rows


def _burn(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


@contextlib.contextmanager
def neighbour(on: bool = True):
    """A busy neighbour for the whole block: another process that keeps one core busy (pure
    Python, so it holds its core the way a batch job or a sidecar does), stopped after it."""
    if not on:
        yield
        return
    stop = multiprocessing.Event()
    hog = multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
    hog.start()
    try:
        yield
    finally:
        stop.set()
        hog.join(5)
        if hog.is_alive():
            hog.kill()
