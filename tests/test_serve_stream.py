"""Models that yield, on servescope.serve: batched steps, interleaved chunks, a client that
leaves, failures mid-stream, the watchdog, and the figures the report keeps (#15)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import torch

import servescope
from servescope.report import Report
from servescope.serve.batching import Batcher, Item
from servescope.serve.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent


def _served(app, requests, route=("POST", "/predict")):
    """Each request's (status, content type, body) from the app, all sent at once."""

    async def go():
        await app.startup()
        assert await app.wait_ready(120) == "ready", app.failure
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            answers = await asyncio.gather(*(client.request(*route, json=body, headers=headers) for body, headers in requests))
        await app.shutdown()
        return [(r.status_code, r.headers.get("content-type"), r.text) for r in answers]

    return asyncio.run(go())


def _generate():
    sys.path.insert(0, str(ROOT / "examples" / "serve"))
    try:
        from generate import Generate
    finally:
        sys.path.pop(0)
    return Generate


def test_the_generation_example_streams_each_request_its_own_tokens_in_a_shared_batch():
    Generate = _generate()
    bodies = [{"prompt": "the weather today", "max_tokens": 6}, {"prompt": "a much longer prompt about other things entirely", "max_tokens": 3}]
    alone = [_served(servescope.serve(Generate(), max_batch_size=1), [(b, {})])[0] for b in bodies]
    app = servescope.serve(Generate(), max_batch_size=4)
    together = _served(app, [(b, {}) for b in bodies * 2])
    for status, ctype, _ in together:
        assert status == 200 and ctype == "application/x-ndjson"
    tokens = [[json.loads(line)["token"] for line in text.splitlines()] for _, _, text in together]
    assert [len(t) for t in tokens] == [6, 3, 6, 3]  # max_tokens per request, in one batch
    assert [t for _, _, t in together] == [t for _, _, t in alone] * 2  # left padding changes no token
    assert app.batcher.batches < 4  # the four requests shared forwards (warm-up runs outside the batcher)


def test_server_sent_events_and_each_request_recorded_with_its_stream_figures():
    Generate = _generate()
    app = servescope.serve(Generate(), max_batch_size=4)
    (status, ctype, text), = _served(app, [({"prompt": "hi", "max_tokens": 4}, {"Accept": "text/event-stream"})])
    assert status == 200 and ctype == "text/event-stream"
    events = [e for e in text.split("\n\n") if e]
    assert len(events) == 4 and all(e.startswith("data: {") for e in events)
    report = app.recorder.report()
    assert report.streaming.responses == 1 and report.streaming.chunks == 4 and report.streaming.chunk_gap["count"] == 3
    again = Report.from_json(report.to_json())
    assert again.streaming.first_chunk == report.streaming.first_chunk
    both = Report.combine([report, again])
    assert both.streaming.responses == 2 and both.streaming.chunk_gap["count"] == 6


def test_a_model_served_at_its_clients_route_with_an_openai_style_end_event():
    Generate = _generate()
    app = servescope.serve(Generate(), max_batch_size=4, path="/v1/generate", methods=("PUT",), sse_done=True)
    sse = {"Accept": "text/event-stream"}
    [(status, ctype, text), (plain_status, _, plain)] = _served(
        app, [({"prompt": "hi", "max_tokens": 3}, sse), ({"prompt": "hi", "max_tokens": 3}, {})], route=("PUT", "/v1/generate")
    )
    events = [e for e in text.split("\n\n") if e]
    assert status == plain_status == 200 and events[-1] == "data: [DONE]" and len(events) == 4
    assert "[DONE]" not in plain  # JSON lines end with the stream, as before
    other = servescope.serve(Generate(), path="/v1/generate", methods=("PUT",))
    [(wrong, _, body)] = _served(other, [({"prompt": "hi"}, {})], route=("POST", "/v1/generate"))
    assert wrong == 405 and "use PUT /v1/generate" in body


class Words(servescope.Model):
    """postprocess yields one chunk per word; a word "boom" fails mid-stream."""

    example = {"text": "a b"}
    closed: list[str] = []

    def load(self, device):
        return torch.nn.Identity()

    def preprocess(self, request):
        return torch.zeros(1)

    def postprocess(self, output, request):
        try:
            for word in request["text"].split():
                if word == "boom":
                    raise RuntimeError("boom")
                yield {"word": word}
        finally:
            Words.closed.append(request["text"])


def test_a_batchs_postprocess_generators_take_turns_chunk_by_chunk():
    runtime = Runtime(Words())
    runtime.load()
    order = []
    runtime.on_stream = lambda items: [order.append((it.payload["text"], len(it.chunks), it.ended)) or setattr(it, "chunks", []) for it in items]
    items = [Item({"text": "a b c"}), Item({"text": "x y"})]
    runtime.process(items)
    firsts = [text for text, n, ended in order if n]
    assert firsts[:4] == ["a b c", "x y", "a b c", "x y"]  # both answers start before either ends
    assert all(it.ended and it.error is None for it in items)


def test_a_failure_mid_stream_ends_it_with_an_error_line_and_is_counted_failed():
    app = servescope.serve(Words(), max_batch_size=2)
    (status, _, text), = _served(app, [({"text": "one two boom three"}, {})])
    lines = [json.loads(x) for x in text.splitlines()]
    assert status == 200  # the status went out with the first chunk
    assert lines[:2] == [{"word": "one"}, {"word": "two"}]
    assert lines[2]["error"] == "internal error in the model's postprocess" and "request_id" in lines[2] and len(lines) == 3
    assert app.recorder.report().errors == {"stream failed": 1}


def test_a_client_that_leaves_stops_the_models_generator():
    Words.closed.clear()
    runtime = Runtime(Words())
    runtime.load()
    item = Item({"text": "w " * 1000})

    def leave(items):  # the server saw the client go after the first chunk
        for it in items:
            it.chunks = []
            it.cancelled = True

    runtime.on_stream = leave
    runtime.process([item])
    assert Words.closed == [item.payload["text"]]  # closed (its finally ran), not run to the end
    assert item.durations["postprocess"] < 1e9


class Steps(servescope.Model):
    example = {"n": 1}

    def load(self, device):
        return torch.nn.Identity()

    def preprocess(self, request):
        return torch.tensor(request["n"])

    def infer(self, batch):
        for step in range(int(batch.max())):
            yield torch.where(batch > step, step, -1)

    def postprocess(self, step):
        return None if int(step) < 0 else int(step)


def test_each_step_tells_the_watchdog_the_batch_moves_on():
    now = [0]
    runtime = Runtime(Steps())
    runtime.load()
    batcher = Batcher(runtime.process, clock=lambda: now[0])
    seen = []

    def progress():
        now[0] += 10**9
        batcher.progress()
        seen.append(batcher.batch_started_ns)

    runtime.on_progress = progress
    batcher.submit(Item({"n": 4}))
    batcher.submit(Item({"n": 2}))  # one batch: queued before the worker starts
    batcher.start()
    batcher.stop()
    assert seen == [10**9, 2 * 10**9, 3 * 10**9, 4 * 10**9]  # after each of the four steps: never "stuck" while it steps
    batcher.busy, batcher.batch_started_ns = True, 5
    batcher.progress()  # from another thread (a replaced worker that woke up): not the worker's progress
    assert batcher.batch_started_ns == 5


def test_the_streaming_figures_travel_in_deltas_and_to_metrics():
    from servescope.recorder import Recorder

    rec = Recorder(deltas=True)
    rec.record_ns({"infer": 5_000_000}, 30_000_000)
    rec.record_stream(10_000_000, [5_000_000, 7_000_000])
    delta = rec.take_delta()
    assert delta.streaming.responses == 1 and delta.streaming.chunks == 3
    assert delta.streaming.chunk_gap["max_ms"] == 7.0
    prometheus_client = __import__("prometheus_client")
    from servescope.exporters import RecorderCollector

    registry = prometheus_client.CollectorRegistry()
    registry.register(RecorderCollector(rec))
    text = prometheus_client.generate_latest(registry).decode()
    assert "servescope_time_to_first_chunk_seconds_count 1.0" in text
    assert "servescope_chunk_gap_seconds_count 2.0" in text


def test_a_streaming_model_run_inline_still_streams():
    # inline_below_ms: a lone request runs on the event loop; a model that yields must still stream
    app = servescope.serve(Words(), max_batch_size=2, inline_below_ms=10_000)
    (status, ctype, text), = _served(app, [({"text": "one two three"}, {})])
    assert app.info["inline"] is True
    assert status == 200 and ctype == "application/x-ndjson"
    assert [json.loads(x) for x in text.splitlines()] == [{"word": "one"}, {"word": "two"}, {"word": "three"}]


def test_each_answer_of_a_batch_ends_when_it_is_done_not_with_the_longest():
    runtime = Runtime(Words())
    runtime.load()
    runtime.live = []
    ends = []
    runtime.on_stream = lambda items: [ends.append(it.payload["text"]) for it in items if it.ended] or [
        setattr(it, "chunks", []) for it in items
    ]
    short, long_, failing = Item({"text": "a"}), Item({"text": "a b c d e f"}), Item({"text": "a boom b c d e"})
    runtime.process([short, long_, failing])
    rounds = 0
    while runtime.advance():
        rounds += 1
        if rounds == 2:
            assert ends == ["a", "a boom b c d e"]  # the short one and the failed one, long before the long one
    assert ends[-1] == "a b c d e f" and failing.error and not short.error


def test_a_stream_that_fails_in_advance_ends_its_items_and_the_rest_go_on():
    runtime = Runtime(Words())
    runtime.load()
    runtime.live = []
    runtime.on_stream = lambda items: [setattr(it, "chunks", []) for it in items]
    a, b = Item({"text": "x y z"}), Item({"text": "p q r"})
    runtime.process([a])
    runtime.process([b])

    def broken():  # what the watchdog's new worker meets: a generator still running on the stuck thread
        raise ValueError("generator already executing")
        yield

    runtime.live[0] = (broken(), runtime.live[0][1])
    while runtime.advance():
        pass
    assert a.ended and a.error and "generator already executing" in a.error
    assert b.ended and b.error is None  # the other stream went on to its end


class Countdown(Steps):
    closed = 0

    def infer(self, batch):
        try:
            yield from super().infer(batch)
        finally:
            Countdown.closed += 1

    def postprocess(self, step):
        return self.END if int(step) < 0 else int(step)  # -1: this item had all its steps


def test_an_item_whose_postprocess_says_end_ends_at_once_and_the_generator_stops_when_all_have():
    runtime = Runtime(Countdown())
    runtime.load()
    runtime.live = []
    ended_at = {}
    rounds = [0]

    def on_stream(items):
        for it in items:
            it.chunks = []
            if it.ended:
                ended_at.setdefault(it.payload["n"], rounds[0])

    runtime.on_stream = on_stream
    short, long_ = Item({"n": 2}), Item({"n": 6})
    runtime.process([short, long_])
    while runtime.advance():
        rounds[0] += 1
    assert ended_at[2] == 1 and ended_at[6] == 5  # the short answer ended at the step after its last, 4 rounds before the long one
    assert Countdown.closed == 1 and not short.error and not long_.error
    assert repr(servescope.Model.END) == "Model.END"


class SlowWords(Words):
    def postprocess(self, output, request):
        import time

        for word in request["text"].split():
            time.sleep(0.01)
            yield {"word": word}


def test_a_client_that_leaves_mid_stream_is_counted_and_its_stream_stops():
    app = servescope.serve(SlowWords(), max_batch_size=2)

    async def go():
        await app.startup()
        assert await app.wait_ready(60) == "ready", app.failure
        body = json.dumps({"text": "w " * 300}).encode()
        requests, gone, sent = [{"type": "http.request", "body": body, "more_body": False}], asyncio.Event(), []

        async def receive():
            if requests:
                return requests.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                gone.set()  # the client reads one chunk and closes the connection

        await asyncio.wait_for(app({"type": "http", "path": "/predict", "method": "POST", "headers": []}, receive, send), 10)
        await app.shutdown()
        return sent

    sent = asyncio.run(go())
    chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert len(chunks) < 50  # stopped long before its 300 words (3 s)
    assert app.recorder.report().errors == {"client left": 1}  # visible in /report and /metrics, not silent


class Big(Words):
    example = {"n": 2}
    made = 0

    def postprocess(self, output, request):
        for _ in range(request["n"]):
            Big.made += 1
            yield "x" * 65536


def test_a_reader_that_falls_behind_pauses_its_stream_instead_of_piling_it_up_in_memory():
    app = servescope.serve(Big(), max_batch_size=2)

    async def go():
        await app.startup()
        assert await app.wait_ready(60) == "ready", app.failure
        Big.made = 0
        requests = [{"type": "http.request", "body": b'{"n": 200, "text": "x"}', "more_body": False}]
        reading, bodies = asyncio.Event(), []

        async def receive():
            if requests:
                return requests.pop()
            await asyncio.Event().wait()  # the client never leaves

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                bodies.append(len(message["body"]))
                await reading.wait()  # a reader that stalls after its first chunk

        task = asyncio.ensure_future(app({"type": "http", "path": "/predict", "method": "POST", "headers": []}, receive, send))
        await asyncio.sleep(0.5)
        made_while_stalled = Big.made
        reading.set()
        await asyncio.wait_for(task, 30)
        await app.shutdown()
        return made_while_stalled, bodies

    made_while_stalled, bodies = asyncio.run(go())
    assert made_while_stalled <= (1 << 20) // 65536 + 3  # about 1 MiB (MAX_UNSENT_BYTES) ahead of the reader, not 200 chunks (13 MB)
    assert len(bodies) == 200 and Big.made == 200  # once it reads, the whole answer arrives


class BigSteps(Steps):
    def postprocess(self, step):
        return None if int(step) < 0 else "x" * (2 << 20)  # 2 MiB a step: its reader is behind at once


def test_a_batch_waiting_for_its_readers_ends_when_they_leave():
    runtime = Runtime(BigSteps())
    runtime.load()
    runtime.live = []
    runtime.on_stream = lambda items: [setattr(it, "chunks", []) for it in items]  # nothing is ever sent
    item = Item({"n": 50})
    runtime.process([item])
    assert runtime.advance() is False  # its reader is behind: the next step waits
    item.cancelled = True  # the client leaves while its batch waits for it
    states = [runtime.advance() for _ in range(3)]
    assert None in states and item.ended  # the stream ended; it did not wait for ever
