"""OpenAI-compatible endpoints (``bench --openai``): the requests, and the output tokens.

    api = api_of("/v1/chat/completions")                              # "chat"
    bodies, sizes = request_bodies(api, prompts=["Hi"], model="m", max_tokens=64)
    tokens = token_stats(results, api=api, model="m", window_s=10.0)  # load.tokens

Every request asks for a stream (``"stream": true``) with the token counts in its last event
(``"stream_options": {"include_usage": true}``), as vLLM's benchmark does; ``--no-stream``
asks for one plain answer, counted from its ``usage``. The load generator
reads a stream's events without parsing them (``wire.OUTPUT``, ``wire.usage``): an
event is a *token* when it carries text (``delta.content`` or ``delta.reasoning_content`` for
chat, ``text`` for completions, not empty), and the one event that carries ``usage`` is kept
and read once. A response's output tokens are ``usage.completion_tokens`` when the server sent
it, else its events with text (docs/bench.md says where this differs from vLLM's counting).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import orjson

from ..exceptions import ConfigError
from ..sections import Tokens
from ..stats import Distribution, summarize
from .wire import SSE, Result, error_kind

__all__ = ["API", "DEFAULT_MAX_TOKENS", "api_of", "asked_tokens", "first_model", "models_url", "request_bodies", "token_stats"]

API = Literal["chat", "completions"]
DEFAULT_MAX_TOKENS = 128


def api_of(path: str) -> API:
    """Which API a URL path names: ``.../chat/completions`` or ``.../completions``."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    raise ConfigError(
        f"--openai needs the URL of the API, ending in /v1/chat/completions or /v1/completions; got the path {path or '/'!r}"
    )


def models_url(url: str) -> str:
    """Where an OpenAI-compatible server lists its models: ``.../v1/chat/completions`` -> ``.../v1/models``."""
    base, _, query = url.partition("?")
    base = base.rstrip("/")
    for tail in ("/chat/completions", "/completions"):
        if base.endswith(tail):
            base = base[: -len(tail)]
            break
    return base + "/models" + (f"?{query}" if query else "")


def first_model(url: str, *, headers: list[tuple[str, str]] | None = None, timeout_s: float = 10.0) -> str:
    """The first model the server at ``url`` lists (``GET /v1/models``), for a run without
    ``--model``; a ``ConfigError`` that says to give ``--model`` when it lists none."""
    import urllib.error
    import urllib.request

    where = models_url(url)
    request = urllib.request.Request(where, headers=dict(headers or []))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - the user's own URL
            data = orjson.loads(answer.read(1 << 20))
        model = data["data"][0]["id"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        why = getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"--openai without --model: {where} listed no model ({why}); give --model NAME") from None
    if not isinstance(model, str) or not model:
        raise ConfigError(f"--openai without --model: {where} listed no model by name; give --model NAME")
    return model


def _prompt_size(body: dict[str, Any], measure: Callable[[str], int] = len) -> int:
    """The prompt's length (``measure``: characters, or a tokenizer's count): the prompt, or
    every message's text."""
    prompt = body.get("prompt")
    if prompt is not None:
        return measure(prompt) if isinstance(prompt, str) else sum(measure(p) for p in prompt if isinstance(p, str))
    size = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            size += measure(content)
        elif isinstance(content, list):  # parts: [{"type": "text", "text": ...}, {"type": "image_url", ...}]
            size += sum(measure(p.get("text") or "") for p in content if isinstance(p, dict))
    return size


def request_bodies(
    api: API,
    *,
    model: str,
    max_tokens: int | list[int] | None = DEFAULT_MAX_TOKENS,
    prompts: list[str] | None = None,
    lines: list[tuple[int, bytes]] | None = None,
    where: str = "--data",
    stream: bool = True,
    extra: dict[str, Any] | None = None,
    measure: Callable[[str], int] = len,
) -> tuple[list[bytes], list[int]]:
    """The request bodies, and each one's prompt length (``measure``: characters, or a
    tokenizer's count); ``stream=False``: plain answers (``"stream": false``), their tokens
    counted from the answer's ``usage``.

    From ``prompts`` (texts), or from ``lines`` of a data file (``(line number, JSON)``): each
    a prompt (a string, or ``{"prompt": ...}``) or, for chat, ``{"messages": [...]}``; any other
    field of a line (``max_tokens``, ``temperature`` ...) goes into its request as it is.
    ``max_tokens`` as a list: each request's own, the prompts cycled until every one has a
    request; ``extra``: fields for every request (``{"ignore_eos": True}``).
    """
    base: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}} if stream else {"model": model, "stream": False}
    base.update(extra or {})
    items: list[tuple[str, Any]] = [("--prompt", p) for p in prompts or []]
    items += [(f"{where} line {n}", orjson.loads(raw)) for n, raw in lines or []]
    each = max_tokens if isinstance(max_tokens, list) else None
    if each and items:
        items = [items[i % len(items)] for i in range(max(len(items), len(each)))]
    elif max_tokens is not None:
        base["max_tokens"] = max_tokens
    bodies, sizes = [], []
    for i, (name, item) in enumerate(items):
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise ConfigError(
                f'{name}: expected a prompt: "text", {{"prompt": "text"}} or (chat) {{"messages": [...]}}, one of the two'
            )
        body = {**base, **({"max_tokens": each[i % len(each)]} if each else {}), **item}
        if api == "chat" and "prompt" in body:
            prompt = body.pop("prompt")
            if not isinstance(prompt, str):
                raise ConfigError(f"{name}: a chat prompt is one text; give several as messages")
            body["messages"] = [{"role": "user", "content": prompt}]
        elif api == "completions" and "messages" in body:
            raise ConfigError(f"{name}: messages are for /v1/chat/completions; /v1/completions takes a prompt")
        bodies.append(orjson.dumps(body))
        sizes.append(_prompt_size(body, measure))
    return bodies, sizes


def asked_tokens(bodies: list[bytes]) -> list[int | None]:
    """Each request's ``max_tokens`` (or ``max_completion_tokens``): what it asked the server for."""
    out: list[int | None] = []
    for raw in bodies:
        body = orjson.loads(raw)
        n = body.get("max_tokens", body.get("max_completion_tokens"))
        out.append(n if isinstance(n, int) and not isinstance(n, bool) else None)
    return out


def token_stats(
    results: list[Result], *, api: str, model: str | None, window_s: float, asked: list[int | None] | None = None
) -> Tokens:
    """``load.tokens``: the successful responses' output tokens (``Result.usage``, else their
    streamed events with text), their rate over the measured window, and vLLM's TPOT per request:
    (latency - TTFT) / (output tokens - 1), both from the request's start. ``asked``: each
    request's ``max_tokens`` (by ``Result.request``), to count the answers that stopped short."""
    out = Tokens(api=api, model=model)
    tpot = Distribution()
    inputs: int | None = 0
    wanted: int | None = 0 if asked else None
    for r in results:
        if error_kind(r) is not None:
            continue
        out.responses += 1
        times = r.stream[2] if r.stream is not None and r.stream[0] == SSE else None
        if r.usage is not None:
            n, prompt = r.usage
            out.from_usage += 1
            inputs = None if inputs is None or prompt is None else inputs + prompt
        elif times is not None:
            n = len(times)
            out.from_deltas += 1
        else:
            out.uncounted += 1
            continue
        out.output_tokens += n
        want = asked[r.request] if asked and 0 <= r.request < len(asked) else None
        wanted = None if wanted is None or want is None else wanted + want
        out.short_answers += want is not None and n < want
        if times and n > 1:  # latency - TTFT: from the first token to the end of the answer
            tpot.add(max(r.done_ns - times[0], 0) / 1e6 / (n - 1))
    if out.from_usage == 0:
        inputs = None
    out.input_tokens = inputs
    out.asked_output_tokens = wanted if out.responses > out.uncounted else None
    if window_s > 0 and out.responses:
        out.output_tokens_per_s = round(out.output_tokens / window_s, 2)
        if inputs is not None and out.from_usage == out.responses - out.uncounted:  # (prompts of every counted response)
            out.total_tokens_per_s = round((out.output_tokens + inputs) / window_s, 2)
    if len(tpot):
        out.tpot, out.distributions = summarize(tpot), {"tpot": tpot.to_dict()}
    return out

