"""The OpenAI-compatible front of servescope.serve: a streaming Model answers /v1/completions
and /v1/chat/completions as OpenAI's API does (events, usage, [DONE], errors), through the
same runtime (batched, timed)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import servescope
from servescope.exceptions import ConfigError

from test_serve_stream import _generate


def _calls(app, calls):
    """Each (method, path, body) sent at once; their (status, headers, text)."""

    async def go():
        await app.startup()
        assert await app.wait_ready(120) == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            answers = await asyncio.gather(*(client.request(m, p, json=b) for m, p, b in calls))
        await app.shutdown()
        return [(r.status_code, r.headers, r.text) for r in answers]

    return asyncio.run(go())


def _events(text):
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


def test_streamed_completions_and_chats_come_as_openais_events_with_usage_and_done():
    Generate = _generate()
    app = servescope.serve(Generate(), max_batch_size=4, openai="tiny-gpt")
    opts = {"stream": True, "stream_options": {"include_usage": True}}
    (models, completion, chat, plain) = _calls(app, [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"model": "tiny-gpt", "prompt": "the weather today", "max_tokens": 5, **opts}),
        ("POST", "/v1/chat/completions", {"model": "tiny-gpt", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3, **opts}),
        ("POST", "/v1/chat/completions", {"model": "tiny-gpt", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}),
    ])  # fmt: skip
    assert json.loads(models[2])["data"][0]["id"] == "tiny-gpt"

    status, headers, text = completion
    assert status == 200 and headers["content-type"] == "text/event-stream" and "infer" in headers["server-timing"]
    events = _events(text)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    tokens = [e["choices"][0]["text"] for e in parsed if e["choices"] and e["choices"][0]["text"]]
    assert len(tokens) == 5 and all(e["object"] == "text_completion" and e["model"] == "tiny-gpt" for e in parsed)
    assert parsed[-2]["choices"][0]["finish_reason"] == "length"
    usage = parsed[-1]["usage"]
    assert parsed[-1]["choices"] == [] and usage["completion_tokens"] == 5 and usage["prompt_tokens"] == 3  # MiniLM's tokens

    status, _, text = chat
    parsed = [json.loads(e) for e in _events(text)[:-1]]
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"].get("content") for e in parsed[1:] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(deltas) == 3 and parsed[-1]["usage"]["completion_tokens"] == 3

    status, headers, text = plain  # the same chat, not streamed: one answer, the same text
    answer = json.loads(text)
    assert status == 200 and answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "".join(deltas)}
    assert answer["choices"][0]["finish_reason"] == "length"
    report = app.recorder.report()
    assert report.latency["count"] == 3  # the three predictions went through the runtime and were recorded


def test_bad_openai_requests_get_openais_error_shape():
    Generate = _generate()
    app = servescope.serve(Generate(), max_batch_size=2, openai="tiny-gpt")
    answers = _calls(app, [
        ("POST", "/v1/completions", {"model": "tiny-gpt"}),
        ("POST", "/v1/completions", {"model": "tiny-gpt", "prompt": "hi", "max_tokens": 0}),  # the model's validate refuses it
        ("POST", "/v1/chat/completions", {"model": "tiny-gpt", "messages": []}),
        ("GET", "/v1/completions", None),
        ("POST", "/v1/embeddings", {"input": "x"}),
        ("POST", "/predict", {"prompt": "the model's own route still answers", "max_tokens": 2}),
    ])  # fmt: skip
    statuses = [s for s, _, _ in answers]
    assert statuses == [400, 400, 400, 405, 404, 200]
    for _, _, text in answers[:5]:
        error = json.loads(text)["error"]
        assert error["message"] and error["type"] in ("invalid_request_error", "not_found")
    assert "missing field 'prompt'" in json.loads(answers[0][2])["error"]["message"]
    assert "max_tokens" in json.loads(answers[1][2])["error"]["message"]


def test_a_model_that_answers_whole_is_one_chunk_and_its_text_read_by_the_hook():
    class Echo(servescope.Model):
        example = {"prompt": "x", "max_tokens": 4}

        def load(self, device):
            return str.upper

        def infer(self, batch):
            return [self.model(b["prompt"]) for b in batch]

        def collate(self, inputs):
            return inputs

        def postprocess(self, output):
            return {"text": output}

    answers = _calls(servescope.serve(Echo(), openai="echo"), [
        ("POST", "/v1/completions", {"model": "echo", "prompt": "shout", "max_tokens": 4}),
        ("POST", "/v1/completions", {"model": "echo", "prompt": "shout", "stream": True}),
    ])  # fmt: skip
    whole = json.loads(answers[0][2])
    assert whole["choices"][0]["text"] == "SHOUT" and whole["usage"] == {"completion_tokens": 1}  # no tokenizer: no prompt count
    events = _events(answers[1][2])
    assert json.loads(events[0])["choices"][0]["text"] == "SHOUT" and events[-1] == "[DONE]"


def test_the_front_is_named_and_keeps_off_the_models_own_route():
    Generate = _generate()
    with pytest.raises(ConfigError, match="openai must be the model's name"):
        servescope.serve(Generate(), openai="")
    with pytest.raises(ConfigError, match="under /v1/"):
        servescope.serve(Generate(), openai="m", path="/v1/completions")
    chat = Generate().chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert chat == "system: be brief\nuser: hi\nassistant:"
