"""The doctor tells the truth about endpoints that fail, hang, exit, fork or leave threads:
never "no problems found" without measurements, always an exit within its bounds, never a
process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent / "endpoints"


def doctor(target: str, tmp_path: Path, *extra: str, payload: str = '{"x": [1, 2, 3]}', timeout: float = 120):
    (tmp_path / "p.json").write_text(payload)
    out = tmp_path / "report.json"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(HERE / target), "--body", str(tmp_path / "p.json"),
         "--requests", "5", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip
    report = json.loads(out.read_text()) if out.exists() else None
    return p, report, time.monotonic() - t0


def _group_members(marker: str) -> list[str]:
    """Processes still running one of our endpoints (their command line names the marker)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_an_app_without_the_route_is_not_called_healthy_and_gets_the_right_path(tmp_path):
    p, rep, _ = doctor("apps.py:search", tmp_path, "--fail-on", "info")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "No problems found" not in p.stdout
    assert "Could not diagnose" in p.stdout and "--path /search" in p.stdout.replace("\n", " ")
    assert "POST /search" in rep["diagnosis"]["verdict"]["routes"] and "try --path /search" in rep["diagnosis"]["verdict"]["hint"]
    assert rep["diagnosis"]["verdict"]["diagnosed"] is False and rep["diagnosis"]["verdict"]["failures"]["HTTP 404"] >= 5
    assert rep["findings"] == []


def test_a_payload_the_endpoint_rejects_is_not_called_healthy(tmp_path):
    p, rep, _ = doctor("apps.py:strict", tmp_path)
    assert p.returncode == 3 and "Could not diagnose" in p.stdout
    assert "HTTP 422" in rep["diagnosis"]["verdict"]["failures"] and "--body" in rep["diagnosis"]["verdict"]["hint"]


@pytest.mark.parametrize("target", ["apps.py:never", "hostile.py:hangs"])
def test_an_endpoint_that_never_answers_ends_within_the_bound(tmp_path, target):
    p, rep, took = doctor(target, tmp_path, "--timeout", "2")
    assert p.returncode == 3 and "timeout" in rep["diagnosis"]["verdict"]["reason"]
    assert took < 2 * 5 + 10 + 5  # --timeout x phases + margin, plus the interpreter's start


@pytest.mark.parametrize(
    "target, says",
    [
        ("hostile.py:exits", "SystemExit"),
        ("hostile.py:interrupts", "KeyboardInterrupt"),
        ("hostile.py:exits_hard", "exited with status 3"),
    ],
)
def test_an_endpoint_that_ends_its_process_is_its_failure_not_a_silent_exit(tmp_path, target, says):
    p, rep, _ = doctor(target, tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    assert says in rep["diagnosis"]["verdict"]["reason"] or says in json.dumps(rep["diagnosis"]["verdict"]["failures"])
    assert "Could not diagnose" in p.stdout


def test_children_the_endpoint_forks_are_ended_with_the_run(tmp_path):
    p, rep, _ = doctor("hostile.py:forks", tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert rep["latency"]["count"] == 5
    time.sleep(0.5)
    assert _group_members("servescope.doctor.child") == []


def test_a_thread_that_never_ends_does_not_keep_the_doctor_alive(tmp_path):
    p, rep, took = doctor("hostile.py:leaves_a_thread", tmp_path, timeout=60)
    assert p.returncode == 0 and rep["latency"]["count"] == 5 and took < 60


def test_slow_requests_on_torch_threads_do_not_abort_at_exit(tmp_path):
    p, rep, _ = doctor("hostile.py:slow_torch", tmp_path, "--requests", "3", "--concurrency", "2", "--timeout", "10")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "terminate called" not in p.stderr and rep["latency"]["count"] == 3


def test_requests_abandoned_mid_forward_are_timeouts_not_a_clean_bill(tmp_path):
    # each request outlives --timeout: torch is still computing when the doctor ends
    p, rep, took = doctor("hostile.py:slow_torch", tmp_path, "--concurrency", "2", "--timeout", "1")
    assert p.returncode == 3 and "No problems found" not in p.stdout, p.stdout
    assert "timeout" in rep["diagnosis"]["verdict"]["failures"] and "terminate called" not in p.stderr
    assert took < 1 * 5 + 10 + 5


def test_ctrl_c_ends_the_run_and_its_children_within_a_second(tmp_path):
    (tmp_path / "p.json").write_text("{}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "servescope", "doctor", str(HERE / "hostile.py:hangs"), "--body", str(tmp_path / "p.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _group_members("servescope.doctor.child") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert time.monotonic() - t0 < 1.5 and proc.returncode == 130, err
    assert "interrupted" in err
    assert _group_members("servescope.doctor.child") == []


def test_a_huge_payload_is_refused_in_one_line(tmp_path):
    big = tmp_path / "big.json"
    with big.open("w") as f:
        f.write('{"x": "')
        f.write("a" * (200 * 1024 * 1024))
        f.write('"}')
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(HERE / "hostile.py:hangs"), "--body", str(big)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "200 MB" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_def_endpoint_with_pure_python_work_is_gil_bound_not_loop_blocked(tmp_path):
    p, rep, _ = doctor("apps.py:gil", tmp_path, "--requests", "20")
    assert p.returncode == 0, p.stdout + p.stderr
    found = {f["id"]: f for f in rep["findings"]}
    assert "event-loop-blocked" not in found, found.get("event-loop-blocked")
    busy = rep["diagnosis"]["not_checked"].get("gil-contention", "")
    if "busy with other processes" in busy:  # a shared machine: said, not guessed (the only other answer)
        return
    assert "gil-contention" in found, (rep["diagnosis"]["evidence"]["concurrent"], list(found))
    assert "apps.py" in found["gil-contention"]["evidence"]["hot_spot"]


def test_a_put_route_a_get_with_a_query_and_an_upload_are_diagnosed_through_the_cli(tmp_path):
    p, rep, _ = doctor("routes.py:app", tmp_path, "--path", "/v1/embed", "--experiments", "0", payload='{"text": "a red shoe"}')
    assert p.returncode == 0, p.stdout + p.stderr
    assert rep["meta"]["request"] == "PUT /v1/embed, a JSON body" and not rep["errors"] and rep["latency"]["count"] == 5
    image = tmp_path / "cat.bin"
    image.write_bytes(bytes(range(256)) * 16)
    out = tmp_path / "upload.json"
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(HERE / "routes.py:app"), "--path", "/classify", "--file", f"image={image}",
         "--requests", "5", "--experiments", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    assert rep["meta"]["request"] == "POST /classify, a form upload (image)" and not rep["errors"]
    assert "repeated" in rep["diagnosis"]["evidence"]["missing"]  # a binary file: not varied, and said


def test_a_method_the_route_does_not_take_is_one_line_and_exit_2(tmp_path):
    p, rep, _ = doctor("routes.py:app", tmp_path, "--path", "/v1/embed", "-X", "POST")
    assert p.returncode == 2 and rep is None
    assert p.stderr.strip() == "servescope: error: /v1/embed does not take POST: it takes PUT", p.stderr


def test_the_apps_requests_one_at_a_time_run_on_the_main_thread_as_under_a_sync_worker(tmp_path):
    """glibc's main heap is the one a gunicorn sync worker's (and uvicorn's loop's) requests use."""
    log = tmp_path / "threads.log"
    (tmp_path / "flask_threads.py").write_text(
        "import threading\nfrom flask import Flask\napp = Flask(__name__)\n\n\n"
        "@app.post('/predict')\ndef predict():\n"
        f"    open({str(log)!r}, 'a').write(threading.current_thread().name + '\\n')\n"
        "    return {'ok': True}\n"
    )
    (tmp_path / "p.json").write_text("{}")
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", str(tmp_path / "flask_threads.py") + ":app", "--body", "p.json", "--requests", "5",
         "--concurrency", "2"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    names = log.read_text().split()
    # the first request and the 5 warm ones (each waits up to 0.25 s for the main thread to let the
    # last go: on a busy machine one may now and then go to another thread)
    assert names[0] == "MainThread" and names[:6].count("MainThread") >= 4, names
    assert len(set(names)) > 1  # (at concurrency, threads of their own)
