"""bench's LLM workloads against a real loopback server (tests/servers.py): a trace replayed
at its own times and sizes, conversations whose history grows turn by turn (the server's own
token counts agree), and each request's HTTP phases."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from servescope.load.bench import BenchOptions, run_bench
from servescope.load.loadgen import URL
from servescope.load.sessions import SessionGenerator, SessionPlan
from servescope.load.trace import read_trace

pytestmark = pytest.mark.e2e
MS = 1_000_000


def cli(url: str, *args: str, out=None) -> subprocess.CompletedProcess:
    extra = ["--json", str(out)] if out else []
    return subprocess.run([sys.executable, "-m", "servescope", "bench", url, *args, *extra], capture_output=True, text=True, timeout=120)


def test_a_trace_is_sent_at_its_own_times_with_its_own_sizes(test_server, tmp_path):
    """Each request is due at its line's time (sped up 2x), asks the server for its
    output_length, and holds input_length tokens by the server's own count."""
    lines = [(0, 12, 3), (400, 40, 5), (150, 25, 2), (900, 7, 4), (900, 60, 6), (1300, 33, 1)]
    trace_file = tmp_path / "trace.jsonl"
    trace_file.write_text("".join(json.dumps({"timestamp": 5000 + t, "input_length": n, "output_length": m}) + "\n" for t, n, m in lines))
    out = tmp_path / "r.json"
    p = cli(f"{test_server}/v1/completions?ttft_ms=10&gap_ms=5", "--openai", "--trace", str(trace_file), "--trace-speedup", "2",
            "--csv", str(tmp_path / "log.csv"), out=out)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    assert rep["meta"]["mode"] == "open loop, trace replay" and rep["meta"]["trace"]["requests"] == 6 and rep["meta"]["speedup"] == 2
    tk = rep["load"]["tokens"]
    in_order = sorted(lines)
    assert tk["responses"] == 6 and tk["output_tokens"] == sum(m for _, _, m in lines) == tk["asked_output_tokens"]
    assert tk["input_tokens"] == sum(n for _, n, _ in lines)  # the server's usage: each prompt of its input_length words
    assert rep["latency"]["count"] == 6 and rep["load"]["requests"]["warmup"] == 0

    # the times: from the API, each due time exactly the trace's (halved), and sent on time
    trace = read_trace(str(trace_file))
    seen = []
    options = BenchOptions(url=f"{test_server}/delay", trace=trace, trace_speedup=2.0, duration_s=None, warmup_s=0)
    run_bench(options, on_results=lambda mode, level, results, start: seen.extend(results))
    # each counts from its due time, or from its send when that was within 1 ms of it (the timer's
    # jitter, loadgen.LATE_NS): so each start is within 1 ms of the trace's time, halved
    start = sorted(min(r.scheduled_ns, r.sent_ns) for r in seen)
    assert np.allclose(np.diff(start) / MS, np.diff([t for t, _, _ in in_order]) / 2, atol=2.01)
    assert max(r.sent_ns - r.scheduled_ns for r in seen) < 200 * MS  # (bound generously: a busy machine wakes late)


def test_conversations_carry_the_servers_own_answers_turn_by_turn(test_server):
    """Turn k's prompt is every earlier prompt and answer plus a new one: the server counts its
    words (usage.prompt_tokens) as the generator says, and each answer is the server's text."""
    plan = SessionPlan(api="chat", base={"model": "test-model", "stream": True, "stream_options": {"include_usage": True}},
                       prompts=["one two three", "four five"], max_tokens=[4, 2], turns=3,
                       measure=lambda t: len(t.split()), unit="words")  # fmt: skip
    gen = SessionGenerator(URL.parse(f"{test_server}/v1/chat/completions?ttft_ms=5&gap_ms=2"), plan)
    results = asyncio.run(gen.closed_sessions(concurrency=2, sessions=4))
    assert gen.started == gen.completed == 4 and len(results) == 12
    for r in results:
        assert r.status == 200 and r.usage is not None
        completion, prompt = r.usage
        assert prompt == gen.sizes[r.request] and completion == gen.asked[r.request]
    # sessions 0 and 2: "one two three" (4 tokens back), "four five" (2), "one two three": 3, 3+4+2, 9+2+3 words;
    # sessions 1 and 3 start from the cycle's next prompt: "four five" (2 back), "one two three" (4), "four five": 2, 7, 13
    assert sorted(gen.sizes) == [2, 2, 3, 3, 7, 7, 9, 9, 13, 13, 14, 14]


def test_the_cli_reports_each_turn_and_the_http_phases(test_server, tmp_path):
    out = tmp_path / "s.json"
    p = cli(f"{test_server}/v1/chat/completions?ttft_ms=30&gap_ms=5", "--openai", "--turns", "3", "--input-tokens", "10",
            "--max-tokens", "4", "-c", "2", "-d", "2", "--warmup", "0.3", out=out)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    load = json.loads(out.read_text())["load"]
    ss = load["sessions"]
    assert ss["turns"] == 3 and ss["completed"] >= 5 and [t["turn"] for t in ss["by_turn"]] == [1, 2, 3]
    # the history grows by the last prompt and the answer's 4 words each turn (approximate count: words)
    assert [t["prompt_mean"] for t in ss["by_turn"]] == [10, 24, 38]
    for t in ss["by_turn"]:
        assert t["errors"] == 0 and 28 <= t["ttft_p50_ms"] <= 60 and 43 <= t["p50_ms"] <= 90
    assert "Conversations of 3 turns" in p.stdout
    http = load["http"]
    assert http["connections"] >= 2 and http["ttfb"]["count"] == load["requests"]["ok"]
    assert 0 < http["ttfb"]["p50_ms"] < 30 <= http["transfer"]["p50_ms"] + http["ttfb"]["p50_ms"]  # (SSE head first, tokens later)
    assert "HTTP: time to first byte" in p.stdout
