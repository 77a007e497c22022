"""The doctor against every example endpoint: each expected finding present, no others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "examples" / "doctor"

EXPECTED = {
    "healthy_function.py:predict": set(),
    "healthy_serve.py:app": set(),
    "load_per_request.py:predict": {"model-load-per-request"},
    "cold_start.py:predict": {"cold-start"},
    "training_mode_fastapi.py:app": {"training-mode"},
    "grad_enabled_flask.py:app": {"grad-enabled"},
    # FastAPI encodes the response on the event loop even for `def` endpoints: both are true
    "slow_serialization_fastapi.py:app": {"slow-serialization", "event-loop-blocked"},
    # the model runs on the loop, so requests queue and never share a forward
    "event_loop_blocked_fastapi.py:app": {"event-loop-blocked", "no-batching"},
    "thread_oversubscription.py:predict": {"thread-oversubscription"},
    # transformers, called as model(**inputs)
    "hf_search_fastapi.py:app": {"model-load-per-request", "repeated-work", "no-batching"},
    "hf_search_healthy_fastapi.py:app": set(),
    "hf_classifier_flask.py:app": {"padding-waste", "grad-enabled", "no-batching"},
    "st_healthy_function.py:predict": set(),
    # ONNX Runtime
    "onnx_per_request.py:predict": {"model-load-per-request", "no-batching"},
    "onnx_no_batching.py:predict": {"no-batching"},
    "onnx_healthy_batch.py:predict": set(),
    "onnx_healthy_flask.py:app": set(),
    # scikit-learn; the Starlette endpoint is `async def`, so its pandas work also holds the loop
    "sklearn_pandas_starlette.py:app": {"slow-preprocess", "event-loop-blocked"},
    "sklearn_healthy_function.py:predict": set(),
    # scikit-learn: a request's rows scored one `predict_proba([row])` at a time (one call for all
    # of them is tried: per-item-calls), and concurrent requests never share a call either
    "sklearn_per_row_function.py:predict": {"per-item-calls", "no-batching"},
    "sklearn_healthy_fastapi.py:app": set(),
    # Pillow: the pixels read as a Python list (the fix quotes that line: test below)
    "image_getdata_fastapi.py:app": {"slow-preprocess"},
    # scikit-learn: a fixed corpus vectorised again on every request (the fix: once, at start-up)
    "tfidf_search_fastapi.py:app": {"repeated-work"},
    # LightGBM through joblib, loaded in the handler: its libraries are first imported during a
    # request (the first request pays that: cold-start), and a booster answers 16 rows at once
    "gbm_per_request_fastapi.py:app": {"model-load-per-request", "cold-start", "no-batching"},
    # a token streamer: each stream decodes alone, and inference_mode around its yield fails
    # streams once Starlette resumes them on other threads
    "gpt2_stream_fastapi.py:app": {"no-batching", "failing-requests"},
    # a token streamer decoding in an `async def` generator: every step on the loop
    "gpt2_async_stream_fastapi.py:app": {"event-loop-blocked", "no-batching"},
    # a PUT route taking a multipart upload (the doctor takes the route's own method; --file)
    "upload_put_fastapi.py:app": {"model-load-per-request"},
}

#: causes that are real on an example but whose measured size sits near the doctor's bar, so a
#: run may or may not name them; they must be the only extra findings, and the main one first
MAY_ALSO = {
    # TfidfVectorizer.transform is Python (a regex and dict counting): 8 callers share one core
    # (gil-contention), and 16 queries in one transform cost less each than one (no-batching)
    "tfidf_search_fastapi.py:app": {"gil-contention", "no-batching"},
    # a small conv net: one forward of 16 images costs less each than one alone, near the bar;
    # its first request takes 21-35 ms more than a warm one quiet (the bar is 50) and 25-85 ms
    # more beside a busy neighbour (uvicorn started six times each, by hand: session 14)
    "upload_put_fastapi.py:app": {"no-batching", "cold-start"},
    # the pixel list is Python work that holds the GIL (8 callers: 1.06x one's throughput), true,
    # but its requests take 4-6 ms against the 5-ms floor under which the GIL is not judged
    # (rules/causes.py GIL_MIN_REQUEST_MS): named in 2 of 2 runs at 5.3-6.1 ms (session 15).
    # Its small net's forward runs alone at 0.29-0.34 ms an item at batch 1, near the bar
    # (no-batching): named, low, in 3 of 4 quiet runs once the loop watch stopped ticking in
    # the unprobed phases (session 27)
    "image_getdata_fastapi.py:app": {"gil-contention", "no-batching"},
    # predict_proba on one row costs 0.12-0.24 ms an item against the 0.2-ms floor a forward must
    # clear (16x less an item at batch 16): named, low, in 1 of 5 fresh clones (session 19)
    "sklearn_pandas_starlette.py:app": {"no-batching"},
    # a forest's predict_proba is Python around its trees: 8 callers got 0.66x the throughput of
    # one on a quiet machine (true), not judged where the cores are busy (session 20)
    "sklearn_per_row_function.py:predict": {"gil-contention"},
}

#: the payload and route of the examples that do not take x256.json at /predict
ARGS = {
    "hf_search_fastapi.py:app": ("query.json", "/search"),
    "hf_search_healthy_fastapi.py:app": ("texts16.json", "/search"),
    "hf_classifier_flask.py:app": ("query.json", "/predict"),
    "st_healthy_function.py:predict": ("texts16.json", "/predict"),
    "onnx_healthy_batch.py:predict": ("rows16.json", "/predict"),
    "sklearn_healthy_function.py:predict": ("rows16.json", "/predict"),
    "sklearn_per_row_function.py:predict": ("rows16.json", "/predict"),
    "onnx_healthy_flask.py:app": ("rows16.json", "/predict"),
    "sklearn_healthy_fastapi.py:app": ("rows16.json", "/predict"),
    "image_getdata_fastapi.py:app": ("image.json", "/predict"),
    "tfidf_search_fastapi.py:app": ("query.json", "/search"),
    "gbm_per_request_fastapi.py:app": ("features.json", "/score"),
    "gpt2_stream_fastapi.py:app": ("prompt_ids.json", "/generate"),
    "gpt2_async_stream_fastapi.py:app": ("prompt_ids.json", "/generate"),
    "upload_put_fastapi.py:app": ("image=photo.jpg", "/v1/classify"),  # FIELD=FILE: a multipart upload
}


def judged(target: str, report: dict) -> set[str]:
    """The causes a report names that the gallery judges (bench/gallery_stability.py too): on a
    busy machine, where other processes took CPUs while it ran and fewer torch threads (or
    OpenMP's idle threads asleep, tried in fresh processes) measured faster, those are true at
    that moment too (the test machine is shared); ``MAY_ALSO``'s causes near their bar."""
    found = {f["id"] for f in report["findings"]}
    if (report["diagnosis"]["evidence"].get("machine") or {}).get("busy"):
        found -= {"thread-oversubscription", "openmp-spin-wait"} - EXPECTED[target]
    return found - MAY_ALSO.get(target, set())


def command(target: str, *extra: str) -> list[str]:
    """The doctor's command line for a gallery example, as a user would type it (bench/gallery_stability.py too)."""
    payload, path = ARGS.get(target, ("x256.json", "/predict"))
    field, _, upload = payload.rpartition("=")
    body = ["--file", f"{field}={GALLERY / upload}"] if field else ["--body", str(GALLERY / payload)]
    return [sys.executable, "-m", "servescope", "doctor", str(GALLERY / target), *body, "--path", path, "--requests", "15", *extra]


def doctor(target: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(target, *extra),
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


#: each example's run as a user types it, once for every test here that reads it (a doctor run
#: is 5-50 s: the suite's largest part)
_RUNS: dict[str, tuple[subprocess.CompletedProcess, dict | None]] = {}


def run_once(target: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict | None]:
    if target not in _RUNS:
        where = tmp_path_factory.mktemp("gallery")
        out = where / "report.json"
        p = doctor(target, where, "--json", str(out))
        _RUNS[target] = (p, json.loads(out.read_text()) if out.exists() else None)
    return _RUNS[target]


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_the_doctor_names_exactly_the_causes_present(target, tmp_path_factory):
    p, report = run_once(target, tmp_path_factory)
    assert p.returncode == 0 and report is not None, p.stderr
    found = judged(target, report)
    if target in MAY_ALSO:  # the main cause is not outranked by the ones near the bar (a tie may go either way)
        rank = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}
        main = max((rank[f["severity"]] for f in report["findings"] if f["id"] in EXPECTED[target]), default=-1)
        near = [(f["id"], f["severity"]) for f in report["findings"] if f["id"] in MAY_ALSO[target] - EXPECTED[target]]
        # (gil-contention's share on 2 CPUs is 1 - scaling / 2: for code that does not scale at all,
        # half the server time, the bar between high and critical; one level above it is a tie)
        assert all(rank[sev] <= main + (fid == "gil-contention") for fid, sev in near), (main, near)
    assert found == EXPECTED[target], [(f["id"], f["severity"], f["evidence"]) for f in report["findings"]]
    for f in report["findings"]:
        assert f["fix"] and f["evidence"] and f["title"]
        if target == "image_getdata_fastapi.py:app" and f["id"] == "slow-preprocess":  # the user's own line, with the idiom that replaces its pixel list
            # (list(img.getdata()) holds the GIL: the sampler lands on its line only with the short switch
            # interval of the sequential requests, StackSampler.precise_lines)
            assert "np.array(list(img.getdata())" in f["fix"] and "np.asarray(img" in f["fix"]
        if target == "gbm_per_request_fastapi.py:app" and f["id"] == "model-load-per-request":
            assert "joblib.load" in f["fix"] and "torch" not in f["fix"] and f["saving_basis"] == "measured"
        if target == "gpt2_async_stream_fastapi.py:app" and f["id"] == "event-loop-blocked":  # the generator, not the route
            assert "make the generator a plain `def`" in f["fix"] and "first chunk" in f["saving_load"]
        if target == "gpt2_stream_fastapi.py:app":  # each cause in a streaming endpoint's own terms
            assert "decode alone" in f["title"] if f["id"] == "no-batching" else "inference_mode" in f["fix"]
        if target == "sklearn_per_row_function.py:predict" and f["id"] == "per-item-calls":  # the rows in one call, tried
            assert "predict_proba(np.vstack(rows))" in f["fix"] and f["saving_basis"] == "measured" and f["saving_load"] == "c=1"
        if target == "tfidf_search_fastapi.py:app" and f["id"] == "repeated-work":  # scikit-learn's call, in its own idiom, measured
            assert "TfidfVectorizer.transform" in f["fix"] and "torch" not in f["fix"] and f["saving_basis"] == "measured"
    assert "Baseline p50 latency" in p.stdout
    # a minute and a half at most on 2 cores; beside other work (slower requests, and OpenMP's
    # wait policy tried in two fresh processes) bounded generously
    busy = (report["diagnosis"]["evidence"].get("machine") or {}).get("busy")
    assert report["diagnosis"]["evidence"]["seconds"] < (180 if busy else 90)


def test_the_fix_names_the_hot_spot_it_follows(tmp_path):
    out = tmp_path / "report.json"
    # 40 requests, not 15: the sampler gets the GIL from this `async def` handler's pandas code
    # only at the switch interval, and 15 requests' preprocessing left it no sample in 1 run of 6
    doctor("sklearn_pandas_starlette.py:app", tmp_path, "--json", str(out), "--requests", "40")
    [f] = [f for f in json.loads(out.read_text())["findings"] if f["id"] == "slow-preprocess"]
    assert "pandas" in f["evidence"]["hot_spot"] and "np.asarray" in f["fix"]


def test_a_fix_that_cannot_reach_the_work_on_the_loop_is_not_measured_as_no_gain(tmp_path_factory):
    # a `def` endpoint whose big response FastAPI encodes on the loop: moving the endpoint
    # function off the loop changes nothing there, and the doctor must not say "no gain"
    p, report = run_once("slow_serialization_fastapi.py:app", tmp_path_factory)
    assert report is not None, p.stderr
    what_if = report["diagnosis"]["evidence"]["experiments"]["off-the-loop"]
    assert not what_if["tried"] and "never took effect" in what_if["why_not"]
    [f] = [f for f in report["findings"] if f["id"] == "event-loop-blocked"]
    assert f["saving_basis"] == "estimated" and "not tried" in f["detail"]


def test_fail_on_turns_a_finding_into_an_exit_status(tmp_path):
    assert doctor("load_per_request.py:predict", tmp_path, "--fail-on", "high").returncode == 1
    assert doctor("healthy_function.py:predict", tmp_path, "--fail-on", "info").returncode == 0
