"""servescope bench against real servers on loopback (generous bounds: a shared 2-core box)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from servescope.load.bench import NETWORK, BenchOptions, run_bench

from .conftest import start_server, stop

pytestmark = pytest.mark.e2e
DELAY_MS = 20.0


def test_fixed_delay_is_measured_within_a_small_margin(test_server):
    [rep] = run_bench(BenchOptions(url=f"{test_server}/delay", concurrency=[2], duration_s=2, warmup_s=0.3))
    # stated margin: the p50 sits within [delay, delay + 8 ms] (timer slack and a loaded box)
    assert DELAY_MS <= rep.latency["p50_ms"] <= DELAY_MS + 8
    assert rep.latency["count"] >= 50 and not rep.errors
    assert DELAY_MS - 1 <= rep.stages["infer"]["p50_ms"] <= DELAY_MS + 8
    assert NETWORK in rep.stages
    assert rep.latency["first_ms"] >= DELAY_MS


def test_open_loop_shows_a_stall_that_a_closed_loop_hides(test_server):
    # the server blocks its event loop for 500 ms once, 1 s after its first /stall request
    [rep] = run_bench(BenchOptions(url=f"{test_server}/stall", rate=[50.0], duration_s=3, warmup_s=0))
    assert rep.latency["max_ms"] >= 400
    # ~25 requests scheduled during the stall wait for it: well over 1% of 150
    assert rep.latency["p99_ms"] >= 200
    assert "schedule_lag_p99_ms" in rep.extra["generator"]


def test_errors_by_status_are_counted(test_server):
    [rep] = run_bench(BenchOptions(url=f"{test_server}/error", concurrency=[1], requests=20, warmup_s=0))
    assert rep.errors == {"HTTP 503": 20}
    assert rep.latency["count"] == 0


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servescope", "bench", *args], capture_output=True, text=True, timeout=120, **kw)


def test_cli_sweep_writes_json_and_html_with_the_same_numbers(test_server, tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    p = run_cli(f"{test_server}/delay", "-c", "1,4", "-d", "1", "--warmup", "0.2", "--json", str(out), "--html", str(page))
    assert p.returncode == 0, p.stderr
    assert "Throughput vs latency" in p.stdout and "model inference" in p.stdout
    data = json.loads(out.read_text())
    assert [row["level"] for row in data["sweep"]["rows"]] == [1, 4]
    assert data["stages"]["infer"]["count"] == data["latency"]["count"]
    html = page.read_text()
    assert f"{data['latency']['p50_ms']:.2f} ms" in html


def test_cli_csv_has_a_row_per_measured_request_of_every_level(test_server, tmp_path):
    import csv

    out, rows_csv, page = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.html"
    p = run_cli(f"{test_server}/delay", "--rate", "20,40", "-d", "1", "--warmup", "0.3", "--json", str(out), "--csv", str(rows_csv), "--html", str(page))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    with open(rows_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    measured = [level["load"]["requests"]["measured"] for level in data["sweep"]["levels"]]
    assert [sum(1 for r in rows if r["level"] == lv) for lv in ("20", "40")] == measured
    assert len(rows) == sum(measured) >= 40
    odd = [r for r in rows if r["mode"] != "rate" or r["status"] != "200" or float(r["latency_ms"]) < 0.9 * DELAY_MS]
    assert not odd, odd[:3]  # (0.9: the server's timer may fire a hair early)
    assert all(r["server_timing"].startswith("infer=") for r in rows)
    assert all(0 <= float(r["scheduled_ms"]) <= 1100 for r in rows)  # offsets into the measured second
    windows = data["load"]["timeline"]["windows"]
    assert sum(w["ok"] + w["errors"] for w in windows) == measured[-1]
    assert "Latency over time" in page.read_text() and f"Request log ({len(rows)} requests) saved" in p.stdout


def test_unreachable_url_is_one_line_and_exit_2():
    p = run_cli("http://127.0.0.1:9/predict", "-d", "1")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["servescope: error: cannot reach http://127.0.0.1:9/predict: connection refused"]


def test_ctrl_c_still_writes_the_report(test_server, tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "servescope", "bench", f"{test_server}/delay", "-c", "2", "-d", "30", "--warmup", "0", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.5)  # let it measure for a while; the test bounds the run, not a readiness wait
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    data = json.loads(out.read_text())
    assert data["meta"]["interrupted"] is True and data["latency"]["count"] >= 20


def test_a_server_that_dies_mid_run_is_data(tmp_path):
    proc, port = start_server("servers:app")
    out = tmp_path / "r.json"
    bench = subprocess.Popen(
        [sys.executable, "-m", "servescope", "bench", f"http://127.0.0.1:{port}/fast", "-c", "2", "-d", "3", "--warmup", "0", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    stop(proc)
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr
    data = json.loads(out.read_text())
    assert data["latency"]["count"] > 0
    assert data["errors"].get("connection refused", 0) + data["errors"].get("connection reset", 0) > 0


def test_doctor_url_checks_a_running_endpoint_from_outside(test_server, tmp_path):
    payload = tmp_path / "p.json"
    payload.write_text('{"x": 1}')
    out = tmp_path / "d.json"
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", "--url", f"{test_server}/delay", "--body", str(payload), "--requests", "10", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "Concurrency scaling: 1 caller" in p.stdout
    data = json.loads(out.read_text())
    assert data["stages"]["infer"]["count"] == 10  # the server's Server-Timing breakdown
    assert data["diagnosis"]["evidence"]["scaling"] > 2  # an async sleep serves 8 callers at once
    assert data["findings"] == []
    assert "outside the process" in data["diagnosis"]["not_checked"]["no-batching"]  # said, not silently skipped


def test_doctor_url_on_an_endpoint_that_fails_could_not_diagnose(test_server, tmp_path):
    payload = tmp_path / "p.json"
    payload.write_text('{"x": 1}')
    out = tmp_path / "d.json"
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "doctor", "--url", f"{test_server}/error", "--body", str(payload), "--requests", "5",
         "--json", str(out), "--fail-on", "info"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 3, p.stdout + p.stderr
    assert "Could not diagnose" in p.stdout and "No problems found" not in p.stdout
    assert json.loads(out.read_text())["diagnosis"]["verdict"]["failures"] == {"HTTP 503": 5}


def test_doctor_needs_a_target_or_a_url_not_both(tmp_path):
    payload = tmp_path / "p.json"
    payload.write_text("{}")
    for args in ([], ["x.py:f", "--url", "http://127.0.0.1:9/"]):
        p = subprocess.run([sys.executable, "-m", "servescope", "doctor", *args, "--body", str(payload)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "TARGET" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_run_whose_requests_mostly_fail_says_so_first_and_exits_3(test_server, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "servescope", "bench", f"{test_server}/reject", "-c", "2", "-n", "40", "--warmup", "0s",
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 3, p.stdout + p.stderr
    first = p.stdout.strip().splitlines()[0]
    assert first.startswith("Most requests failed, so this run did not measure the endpoint: concurrency=2: 40 of 40")
    assert "HTTP 422 x40" in p.stdout and "First error answer: HTTP 422:" in p.stdout and "missing field 'text'" in p.stdout
    assert "sent no Server-Timing" not in p.stdout  # its error answers carry the header: no false hint
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["load"]["first_error_body"].startswith("HTTP 422: {")


def test_compare_calls_a_rerun_within_noise_and_a_slower_server_slower(test_server, tmp_path):
    slow, port = start_server("servers:app", env={"SERVESCOPE_TEST_DELAY": "0.024"})  # 20% slower
    try:
        runs = {}
        for name, url in (("a", f"{test_server}/delay"), ("b", f"{test_server}/delay"), ("slow", f"http://127.0.0.1:{port}/delay")):
            runs[name] = tmp_path / f"{name}.json"
            subprocess.run([sys.executable, "-m", "servescope", "bench", url, "-c", "4", "-d", "3s", "--warmup", "0.5s",
                            "--json", str(runs[name])], capture_output=True, timeout=60, check=True)  # fmt: skip
    finally:
        stop(slow)

    def compare(a, b):
        p = subprocess.run([sys.executable, "-m", "servescope", "compare", str(runs[a]), str(runs[b]), "--fail-if-slower", "10%"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        return p.returncode, " ".join(next(line for line in p.stdout.splitlines() if "p50 latency" in line).split())

    code, same = compare("a", "b")
    assert code == 0 and same.endswith("│ no"), same
    code, slower = compare("b", "slow")
    assert code == 1 and "x slower" in slower and slower.endswith("│ yes"), slower
