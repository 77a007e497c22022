"""--turns: each turn's request carries the history, answers read back from what the
connection kept, and the figures grouped turn by turn."""

from __future__ import annotations

import orjson
import pytest

from servescope.exceptions import ConfigError
from servescope.load.loadgen import SSE, URL, Result
from servescope.load.sessions import SessionGenerator, SessionPlan, answer_text, session_stats, turn_body
from servescope.sections import Load

MS = 1_000_000


def test_a_chat_turn_sends_every_earlier_prompt_and_answer_then_the_new_prompt():
    body = turn_body("chat", {"model": "m", "stream": True}, [("hi", "hello!"), ("and?", "more")], "bye", 8)
    assert body == {"model": "m", "stream": True, "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"},
        {"role": "user", "content": "and?"}, {"role": "assistant", "content": "more"},
        {"role": "user", "content": "bye"}]}  # fmt: skip
    body = turn_body("completions", {"model": "m"}, [("hi", "hello!")], "bye", 4)
    assert body == {"model": "m", "max_tokens": 4, "prompt": "hi\nhello!\nbye"}


def test_an_answer_is_read_from_its_stream_or_its_whole_body():
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}',
              b'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": null}]}',
              b"data: not json"]  # fmt: skip
    assert answer_text(events, "chat") == "Hello"
    assert answer_text([b'data: {"choices": [{"text": "a b"}]}', b'data: {"choices": [{"text": " c"}]}'], "completions") == "a b c"
    whole = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "Hi there"}}]})
    assert answer_text([whole[:10], whole[10:]], "chat") == "Hi there"
    assert answer_text([orjson.dumps({"choices": [{"text": "x"}]})], "completions") == "x"
    assert answer_text([b"{oops"], "chat") == "" and answer_text([], "chat") == ""


def test_a_plan_needs_prompts_and_a_known_api():
    with pytest.raises(ConfigError, match="need prompts"):
        SessionPlan(api="chat", base={}, prompts=[], max_tokens=[4], turns=2)
    with pytest.raises(ConfigError, match="chat or completions"):
        SessionPlan(api="embeddings", base={}, prompts=["a"], max_tokens=[4], turns=2)


def test_each_turn_request_is_built_from_the_plan_in_turn_and_measured():
    plan = SessionPlan(api="chat", base={"model": "m"}, prompts=["a b", "c", "d e f"], max_tokens=[4, 8], turns=2, measure=lambda t: len(t.split()), unit="words")
    gen = SessionGenerator(URL.parse("http://127.0.0.1:9/v1/chat/completions"), plan)
    raw, prompt = gen._request(1, 1, [("d e f", "x y")])  # session 1, turn 1: the 4th prompt and max_tokens of the cycle
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1") and b"Content-Length: %d" % len(body) in head
    assert prompt == "a b" and orjson.loads(body)["max_tokens"] == 8
    assert gen.turn_of == [1] and gen.sizes == [3 + 2 + 2] and gen.asked == [8]


def test_figures_are_grouped_by_turn_and_cut_conversations_counted():
    plan = SessionPlan(api="chat", base={}, prompts=["a"], max_tokens=[4], turns=2, unit="tokens")
    gen = SessionGenerator(URL.parse("http://127.0.0.1:9/v1/chat/completions"), plan)
    gen.turn_of, gen.sizes, gen.started, gen.completed = [0, 1, 0, 1], [10, 30, 10, 50], 3, 2
    results = [
        Result(0, 0, 100 * MS, 200, None, None, (SSE, 5 * MS, [20 * MS, 60 * MS]), 0),
        Result(200 * MS, 200 * MS, 350 * MS, 200, None, None, (SSE, 205 * MS, [240 * MS]), 1),
        Result(0, 10 * MS, 90 * MS, 200, None, None, (SSE, 15 * MS, [30 * MS]), 2),  # sent late: counts from its due time
        Result(300 * MS, 300 * MS, 310 * MS, 500, None, None, None, 3),
    ]
    stats = session_stats(results, gen)
    assert (stats.turns, stats.started, stats.completed, stats.cut) == (2, 3, 2, 1)
    first, second = stats.by_turn
    assert (first.turn, first.requests, first.errors, first.prompt_mean, first.unit) == (1, 2, 0, 10, "tokens")
    assert first.ttft_p50_ms == pytest.approx(25.0) and first.p99_ms == pytest.approx(99.9, abs=0.2)
    assert (second.turn, second.requests, second.errors, second.prompt_mean) == (2, 2, 1, 40)
    assert second.p50_ms == pytest.approx(150.0) and second.ttft_p50_ms == pytest.approx(40.0)
    back = Load.from_dict({"sessions": stats.to_dict()}).sessions
    assert back == stats
