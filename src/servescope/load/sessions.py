"""``bench --openai --turns N``: multi-turn conversations whose history grows.

    plan = SessionPlan(api="chat", base={"model": "m", "stream": True}, prompts=["Hi", ...],
                       max_tokens=[64], turns=3, think_ns=0)
    gen = SessionGenerator(URL.parse(url), plan)
    results = asyncio.run(gen.closed_sessions(concurrency=4, duration_s=10))
    section = session_stats(measured, gen)      # load.sessions: figures turn by turn

A session is one user's conversation on one keep-alive connection: turn 1 sends a prompt; each
later turn sends the whole history (every prompt and the server's own answer to it, as the
server streamed it) and a new prompt, once the previous answer has ended and ``think_ns`` has
passed. Closed loop (``-c N``): N sessions under way at any time, a new one as one ends. Open
loop (``-r R``): sessions start at R a second whatever the server does, and each turn's latency
counts from when it was due (the session's start for turn 1, the previous answer's end plus the
think time after it), so a server that stalls cannot hide the wait it causes. No turn starts
after the run's end; a session cut there, or by a failed turn, counts as cut.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from ..exceptions import ConfigError
from ..sections import Sessions, TurnRow
from ..stats import Distribution
from .loadgen import LoadGenerator
from .wire import SSE, Result, URL, _connect_error, build_requests, error_kind, schedule

__all__ = ["SessionGenerator", "SessionPlan", "answer_text", "session_stats", "turn_body"]


@dataclass
class SessionPlan:
    """What each session sends: the API, the fields of every request (``base``: model, stream,
    extra fields), the new prompts (turn t of session s takes ``prompts[(s * turns + t) % n]``),
    each turn's ``max_tokens`` (cycled the same way), the turns and the pause before each next
    one; ``measure``: a prompt's size (characters, or a tokenizer's count) in ``unit``."""

    api: str
    base: dict[str, Any]
    prompts: list[str]
    max_tokens: list[int]
    turns: int
    think_ns: int = 0
    measure: Callable[[str], int] = len
    unit: str = "chars"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ConfigError(f"turns must be >= 1, got {self.turns!r}")
        if not self.prompts:
            raise ConfigError("sessions need prompts: --prompt, --data or --input-tokens")
        if self.api not in ("chat", "completions"):
            raise ConfigError(f"sessions take an OpenAI-compatible API, chat or completions, got {self.api!r}")


def turn_body(api: str, base: dict[str, Any], history: list[tuple[str, str]], prompt: str, max_tokens: int) -> dict[str, Any]:
    """The request of one turn: the history (each earlier prompt and its answer) and the new
    prompt, as chat messages, or as one prompt text for ``/v1/completions``."""
    body = {**base, "max_tokens": max_tokens}
    if api == "chat":
        messages: list[dict[str, str]] = []
        for user, assistant in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        body["messages"] = [*messages, {"role": "user", "content": prompt}]
    else:
        body["prompt"] = "".join(f"{user}\n{assistant}\n" for user, assistant in history) + prompt
    return body


def answer_text(pieces: list[bytes], api: str) -> str:
    """An answer's text from what the connection kept: a stream's data lines (each event's
    ``delta.content`` or ``text``), or a whole answer's body (``message.content`` or ``text``)."""
    if not pieces:
        return ""
    if pieces[0][:5] != b"data:":  # a plain answer, in the pieces it came in
        try:
            choice = orjson.loads(b"".join(pieces))["choices"][0]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return ""
        text = (choice.get("message") or {}).get("content") if api == "chat" else choice.get("text")
        return text if isinstance(text, str) else ""
    out = []
    for line in pieces:
        try:
            for choice in orjson.loads(line[5:]).get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
                if isinstance(text, str):
                    out.append(text)
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            continue
    return "".join(out)


class SessionGenerator(LoadGenerator):
    """The load generator, driving conversations: each response resolves its turn's waiter
    instead of sending the next request from a list. ``turn_of``, ``sizes`` and ``asked`` say,
    by ``Result.request``, each request's turn (from 0), prompt size and ``max_tokens``."""

    def __init__(self, target: URL, plan: SessionPlan, **kwargs: Any) -> None:
        super().__init__(target, [b""], openai=True, keep_answers=True, **kwargs)
        self.plan = plan
        self.head = build_requests(target, method="POST", bodies=[b""], headers=plan.headers, content_type="application/json")[0]
        self.head = self.head[: self.head.rindex(b"Content-Length:")]
        self.turn_of: list[int] = []
        self.sizes: list[int] = []
        self.asked: list[int | None] = []
        self.started = self.completed = 0
        self._sessions: set[asyncio.Task[None]] = set()

    def _complete(self, conn: Any, result: Result) -> None:
        self.results.append(result)
        self.in_flight -= 1
        waiter, conn.waiter = conn.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)
        self._check_drained()

    def _request(self, number: int, turn: int, history: list[tuple[str, str]]) -> tuple[bytes, str]:
        plan = self.plan
        k = number * plan.turns + turn
        prompt, max_tokens = plan.prompts[k % len(plan.prompts)], plan.max_tokens[k % len(plan.max_tokens)]
        body = turn_body(plan.api, plan.base, history, prompt, max_tokens)
        data = orjson.dumps(body)
        self.turn_of.append(turn)
        self.sizes.append(sum(plan.measure(u) + plan.measure(a) for u, a in history) + plan.measure(prompt))
        self.asked.append(max_tokens)
        return self.head + b"Content-Length: %d\r\n\r\n" % len(data) + data, prompt

    async def _session(self, number: int, due_ns: int) -> None:
        """One conversation, turn by turn, on one connection (a new one if the server closed it)."""
        self.started += 1
        history: list[tuple[str, str]] = []
        conn = None
        loop = asyncio.get_running_loop()
        for turn in range(self.plan.turns):
            if not self.running:
                return
            if conn is None or not conn.open:
                conn = self.idle.pop() if self.idle else None
                if conn is None or not conn.open:
                    try:
                        conn = await self._connect()
                    except (OSError, asyncio.TimeoutError) as exc:
                        self.results.append(Result(due_ns, due_ns, time.perf_counter_ns(), 0, None, _connect_error(exc)))
                        return
            raw, prompt = self._request(number, turn, history)
            conn.waiter = waiter = loop.create_future()
            self.sent += 1
            self.in_flight += 1
            conn.send(raw, [due_ns, 0], len(self.turn_of) - 1)
            result = await waiter
            if error_kind(result) is not None:
                return
            history.append((prompt, answer_text(conn.last_answer, self.plan.api)))
            due_ns = result.done_ns + self.plan.think_ns
            if turn + 1 < self.plan.turns and due_ns > (now := time.perf_counter_ns()):
                await asyncio.sleep((due_ns - now) / 1e9)
        self.completed += 1
        if conn is not None and conn.open:
            self.idle.append(conn)

    def _start(self, number: int, due_ns: int) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._session(number, due_ns))
        self._sessions.add(task)
        task.add_done_callback(self._sessions.discard)
        return task

    async def closed_sessions(self, *, concurrency: int, duration_s: float | None = None, sessions: int | None = None) -> list[Result]:
        """``concurrency`` conversations under way, each followed by a new one, for
        ``duration_s`` or until ``sessions`` have started."""
        self.running = True
        numbers = iter(range(sessions if sessions is not None else 1 << 62))

        async def worker() -> None:
            for number in numbers:
                await self._start(number, time.perf_counter_ns())

        await self._drive([worker() for _ in range(concurrency)], duration_s)
        return self.results

    async def open_sessions(self, *, rate: float, duration_s: float | None = None, sessions: int | None = None, poisson: bool = False, seed: int | None = None) -> list[Result]:
        """Conversations starting at ``rate`` a second on a fixed (or Poisson) schedule."""
        self.running = True

        async def starter() -> None:
            start = time.perf_counter_ns()
            for number, due in enumerate(schedule(rate, start, poisson=poisson, seed=seed)):
                if sessions is not None and number >= sessions:
                    break
                if (wait := due - time.perf_counter_ns()) > 0:
                    await asyncio.sleep(wait / 1e9)
                self.lags.append(time.perf_counter_ns() - due)
                self._start(number, due)
            await asyncio.gather(*self._sessions, return_exceptions=True)

        await self._drive([starter()], duration_s)
        return self.results

    async def _drive(self, drivers: list[Any], duration_s: float | None) -> None:
        """Run the drivers until ``duration_s`` (or until they end), then let the turns under way
        finish (``_finish``: each gets its timeout) and start no new one."""
        sweeper = asyncio.ensure_future(self._sweep())
        tasks = [asyncio.ensure_future(d) for d in drivers]
        try:
            self._stop_event = asyncio.Event()
            waits = [asyncio.ensure_future(self._stop_event.wait()), asyncio.ensure_future(asyncio.gather(*tasks))]
            await asyncio.wait(waits, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        finally:
            try:
                await self._finish(None)
            finally:
                for task in [*tasks, *self._sessions]:
                    task.cancel()
                await asyncio.gather(*tasks, *self._sessions, return_exceptions=True)
                sweeper.cancel()


def session_stats(measured: list[Result], gen: SessionGenerator) -> Sessions:
    """``load.sessions``: the conversations, and turn by turn the measured requests' latency,
    time to first token and prompt size (the history grows each turn)."""
    plan = gen.plan
    by_turn: dict[int, list[Result]] = {}
    for r in measured:
        if 0 <= r.request < len(gen.turn_of):
            by_turn.setdefault(gen.turn_of[r.request], []).append(r)
    rows = []
    for turn in sorted(by_turn):
        latency, ttft = Distribution(), Distribution()
        sizes = [gen.sizes[r.request] for r in by_turn[turn]]
        errors = 0
        for r in by_turn[turn]:
            if error_kind(r) is not None:
                errors += 1
                continue
            start = min(r.scheduled_ns, r.sent_ns)
            latency.add((r.done_ns - start) / 1e6)
            if r.stream is not None and r.stream[0] == SSE and r.stream[2]:
                ttft.add((r.stream[2][0] - start) / 1e6)
        p50, p99 = latency.percentiles([50, 99]) if len(latency) else (None, None)
        t50, t99 = ttft.percentiles([50, 99]) if len(ttft) else (None, None)
        rows.append(TurnRow(
            turn=turn + 1, requests=len(by_turn[turn]), errors=errors, p50_ms=_ms(p50), p99_ms=_ms(p99),
            ttft_p50_ms=_ms(t50), ttft_p99_ms=_ms(t99), prompt_mean=round(sum(sizes) / len(sizes), 1), unit=plan.unit,
        ))  # fmt: skip
    return Sessions(
        turns=plan.turns, think_ms=round(plan.think_ns / 1e6, 3), started=gen.started, completed=gen.completed,
        cut=gen.started - gen.completed, by_turn=rows,
    )  # fmt: skip


def _ms(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)
