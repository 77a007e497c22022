"""OpenAI-compatible endpoints: the requests built from prompts, what the load generator
counts as a token in an OpenAI stream and where it finds the usage, and the token figures."""

from __future__ import annotations

import orjson
import pytest

from servescope.load import loadgen
from servescope.load.bench import results_report
from servescope.exceptions import ConfigError
from servescope.load.loadgen import SSE, LoadGenerator, Result, URL
from servescope.load.openai_api import api_of, models_url, request_bodies, token_stats
from servescope.report import Report

MS = 1_000_000


@pytest.mark.parametrize(
    "path, api",
    [("/v1/chat/completions", "chat"), ("/v1/completions", "completions"), ("/openai/deployments/x/chat/completions?v=1", "chat")],
)
def test_the_api_is_read_from_the_url_path(path, api):
    assert api_of(path) == api


def test_a_path_that_names_no_api_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="ending in /v1/chat/completions or /v1/completions"):
        api_of("/predict")


def test_models_are_listed_beside_the_api():
    assert models_url("http://h:8/v1/chat/completions") == "http://h:8/v1/models"
    assert models_url("http://h/x/v1/completions?key=1") == "http://h/x/v1/models?key=1"


def test_requests_stream_with_usage_and_take_a_lines_own_fields():
    [chat], sizes = request_bodies("chat", model="m", max_tokens=64, prompts=["Hello there"])
    assert orjson.loads(chat) == {
        "model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello there"}],
    }  # fmt: skip
    assert sizes == [11]
    lines = [(1, b'{"prompt": "abc", "temperature": 0.5, "max_tokens": 8}'), (3, b'"just text"')]
    bodies, sizes = request_bodies("completions", model="m", lines=lines)
    first = orjson.loads(bodies[0])
    assert first["prompt"] == "abc" and first["temperature"] == 0.5 and first["max_tokens"] == 8
    assert orjson.loads(bodies[1])["prompt"] == "just text" and sizes == [3, 9]
    messages = [(2, b'{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}')]
    [body], sizes = request_bodies("chat", model="m", lines=messages)
    assert len(orjson.loads(body)["messages"]) == 2 and sizes == [10]


@pytest.mark.parametrize(
    "api, line, message",
    [
        ("chat", b'{"text": "hi"}', "data line 7: expected a prompt"),
        ("chat", b'{"prompt": "a", "messages": []}', "data line 7: expected a prompt"),
        ("completions", b'{"messages": [{"role": "user", "content": "hi"}]}', "data line 7: messages are for /v1/chat/completions"),
        ("chat", b"[1, 2]", "data line 7: expected a prompt"),
    ],
)
def test_a_line_that_is_no_prompt_is_refused_naming_it(api, line, message):
    with pytest.raises(ConfigError, match=message):
        request_bodies(api, model="m", lines=[(7, line)], where="data")


class FakeTransport:
    def write(self, data):
        pass

    def close(self):
        pass


@pytest.fixture
def clock(monkeypatch):
    now = [0]
    monkeypatch.setattr(loadgen.time, "perf_counter_ns", lambda: now[0])
    return now


def receive(pieces, clock, *, openai=True):
    gen = LoadGenerator(URL.parse("http://127.0.0.1:1/v1/chat/completions"), [b"x"], openai=openai)
    conn = loadgen._Conn(gen)
    conn.connection_made(FakeTransport())
    gen.in_flight = 1
    conn.send(b"", [None, 0], 0)
    for at_ms, data in pieces:
        clock[0] = at_ms * MS
        conn.data_received(data)
    [r] = gen.results
    return r


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"completion_tokens_details":{"reasoning_tokens":0}}}\n\n'


def token(text: bytes) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text + b'"}}],"usage":null}\n\n'


def test_only_events_with_text_are_tokens_and_the_usage_is_read_wherever_reads_split_it(clock):
    r = receive(
        [
            (1, SSE_HEAD + chunk(ROLE)),  # the role, with empty content: not a token
            (100, chunk(token(b"Hel"))),
            (120, chunk(token(b'lo \\"text\\": ') + USAGE[:40])),  # a key inside the text is not one
            (130, chunk(USAGE[40:] + b"data: [DONE]\n\n") + b"0\r\n\r\n"),
        ],
        clock,
    )
    assert r.stream == (SSE, 1 * MS, [100 * MS, 120 * MS])
    assert r.usage == (2, 7) and r.request == 0


def test_without_usage_nothing_is_read_and_other_runs_read_nothing(clock):
    pieces = [(1, SSE_HEAD + chunk(ROLE + token(b"a") + FINISH) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")]
    r = receive(pieces, clock)
    assert r.usage is None and r.stream == (SSE, 1 * MS, [1 * MS])
    plain = receive(pieces, clock, openai=False)  # a plain SSE run: every data event is one
    assert plain.usage is None and len(plain.stream[2]) == 3


def test_a_plain_answer_counts_its_usage(clock):
    answer = b'{"choices":[{"message":{"content":"' + b"x" * 100_000 + b'"}}],"usage":{"prompt_tokens":3,"completion_tokens":512}}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
    data = head + answer
    r = receive([(k, data[k * 4096 : (k + 1) * 4096]) for k in range(len(data) // 4096 + 1)], clock)
    assert r.stream is None and r.usage == (512, 3)


def streamed(tokens: int, usage: tuple[int, int | None] | None, *, gap_ms: int = 20) -> Result:
    times = [(100 + gap_ms * k) * MS for k in range(tokens)]
    return Result(0, 0, times[-1] + MS, 200, None, None, (SSE, MS, times), 0, usage)


def test_tokens_come_from_usage_else_from_deltas_and_tpot_is_vllms():
    results = [streamed(10, (20, 5)), streamed(10, None), Result(0, 0, 5 * MS, 200, None, None, None, 0, None),
               Result(0, 0, 5 * MS, 503, None, None, None, 0, None)]  # fmt: skip
    tk = token_stats(results, api="chat", model="m", window_s=2.0)
    assert (tk.responses, tk.from_usage, tk.from_deltas, tk.uncounted) == (3, 1, 1, 1)
    assert tk.output_tokens == 30 and tk.output_tokens_per_s == 15.0
    # the prompt tokens of the one response with usage; no input + output rate, which would count
    # the other response's output and not its prompt
    assert tk.input_tokens == 5 and tk.total_tokens_per_s is None
    # (latency - TTFT) / (tokens - 1): 181 ms over 19 tokens from usage, over 9 counted
    assert tk.tpot["count"] == 2 and tk.tpot["max_ms"] == pytest.approx(181 / 9, abs=1e-3)
    assert tk.tpot["mean_ms"] == pytest.approx((181 / 19 + 181 / 9) / 2, abs=1e-3)


def test_input_tokens_are_unknown_unless_every_usage_gave_them():
    tk = token_stats([streamed(3, (3, 4)), streamed(3, (3, None))], api="completions", model=None, window_s=1.0)
    assert tk.output_tokens == 6 and tk.input_tokens is None and tk.total_tokens_per_s is None


def test_results_report_adds_tokens_only_for_openai_runs_and_they_combine():
    one = results_report([streamed(4, (4, 1))], measure_from_ns=0, measure_until_ns=1000 * MS, openai="chat", model="m")
    assert one.load.tokens.output_tokens == 4 and one.load.tokens.model == "m"
    assert results_report([streamed(4, None)], measure_from_ns=0).load.tokens is None
    assert Report.from_dict(one.to_dict()).load.tokens == one.load.tokens  # saved and read back
    both = Report.combine([one, one])
    assert both.load.tokens.output_tokens == 8 and both.load.tokens.tpot["count"] == 2
    assert "load.tokens.output_tokens_per_s" in both.meta["not_combined"]
