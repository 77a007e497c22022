"""`servescope serve --openai NAME` on loopback: an OpenAI client's requests (here bench's
--openai, streamed and not, and a conversation) are answered as OpenAI's API answers them, at
the model's own pace."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from .test_serve_e2e import start

pytestmark = pytest.mark.e2e
STEP_MS = 50.0  # tests/e2e/endpoints/streaming_model.py


@pytest.fixture(scope="module")
def server():
    proc, url = start("--max-batch-size", "8", "--openai", "words", target="tests/e2e/endpoints/streaming_model.py:Words")
    yield url
    proc.terminate()
    proc.communicate(timeout=30)


def bench(url: str, *args: str, out) -> dict:
    p = subprocess.run([sys.executable, "-m", "servescope", "bench", url, "--openai", *args, "--warmup", "0.2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())


def test_bench_streams_chats_and_conversations_from_the_openai_front(server, tmp_path):
    models = json.loads(urllib.request.urlopen(f"{server}/v1/models", timeout=10).read())
    assert models["data"][0]["id"] == "words"
    rep = bench(f"{server}/v1/chat/completions", "--prompt", "say six words", "--max-tokens", "6", "-c", "2", "-d", "2", "--turns", "2", out=tmp_path / "a.json")
    load = rep["load"]
    tk, st = load["tokens"], load["stream"]
    assert tk["from_usage"] == tk["responses"] >= 6 and tk["output_tokens"] == 6 * tk["responses"] and tk["short_answers"] == 0
    assert 0.8 * STEP_MS < st["itl"]["p50_ms"] < 2.5 * STEP_MS and st["ttft"]["p50_ms"] < 4 * STEP_MS
    assert [t["turn"] for t in load["sessions"]["by_turn"]] == [1, 2] and load["sessions"]["by_turn"][1]["errors"] == 0
    assert rep["stages"]["infer"]["count"] >= 6  # the runtime's Server-Timing came through the front
    plain = bench(f"{server}/v1/completions", "--prompt", "hi", "--max-tokens", "3", "--no-stream", "-c", "2", "-d", "1", out=tmp_path / "b.json")
    tk = plain["load"]["tokens"]
    assert tk["from_usage"] == tk["responses"] >= 3 and tk["output_tokens"] == 3 * tk["responses"]
    assert plain["latency"]["p50_ms"] > 2.5 * STEP_MS  # the whole answer: three steps
