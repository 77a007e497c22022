from __future__ import annotations

import asyncio
import threading
import time

import httpx
import msgpack
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import servescope
from servescope.exceptions import ConfigError
from servescope.serve.batching import Batcher, Item
from servescope.servertiming import server_timing_durations


class Doubler(servescope.Model):
    """y = 2x on 4 features, through a real nn.Module; records what the runtime did."""

    example = {"x": [0.0, 0.0, 0.0, 0.0]}

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.loads = 0
        self.batch_sizes: list[int] = []
        self.modes: list[tuple[bool, bool]] = []
        self.gate = gate  # when set, forwards once serving wait for it
        self.serving = False  # set once ready (warm-up and its timing runs are over)
        self.served: list[int] = []  # batch sizes once serving

    def load(self, device):
        self.loads += 1
        lin = torch.nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.eye(4) * 2)
        return torch.nn.Sequential(lin, torch.nn.Dropout(0.5))  # dropout: eval() must be on

    def validate(self, payload):
        x = payload["x"]
        if len(x) != 4:
            raise servescope.InvalidPayload("x needs 4 numbers", field="x")
        return x

    def preprocess(self, item):
        if item[0] == -1:
            raise RuntimeError("bad item")
        return torch.tensor(item, dtype=torch.float32)

    def infer(self, batch):
        if self.serving:
            if self.gate is not None:
                self.gate.wait(10)
            self.served.append(batch.shape[0])
        self.batch_sizes.append(batch.shape[0])
        self.modes.append((torch.is_inference_mode_enabled(), self.model.training))
        if (batch[:, 0] == -2).any():
            raise RuntimeError("poisoned batch")
        return self.model(batch)

    def postprocess(self, output):
        if output[0] == -6:
            raise ValueError("cannot postprocess")
        return {"y": output.numpy()}


class Running:
    """Start the app's runtime in-process and talk to it over an in-process transport."""

    def __init__(self, app) -> None:
        self.app = app

    async def __aenter__(self):
        await self.app.startup()
        assert await self.app.wait_ready() == "ready", self.app.failure
        self.app.model.serving = True
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://t")
        return self.client

    async def __aexit__(self, *exc):
        await self.client.aclose()
        await self.app.shutdown()


def run(coro):
    return asyncio.run(coro)


async def until(condition, timeout_s: float = 10.0) -> None:
    """Waits for ``condition()``; a state the test waits for that never comes fails it, never hangs it."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "the state the test waits for did not come"
        await asyncio.sleep(0.005)


def test_predict_answers_with_every_fix_applied_and_a_server_timing():
    model = Doubler()
    app = servescope.serve(model, max_batch_size=8)

    async def go():
        async with Running(app) as client:
            rs = [await client.post("/predict", json={"x": [1, 2, 3, 4]}) for _ in range(3)]
        return rs

    rs = run(go())
    assert all(r.status_code == 200 for r in rs)
    assert rs[0].json() == {"y": [2.0, 4.0, 6.0, 8.0]}  # dropout off: eval() was called
    assert model.loads == 1
    assert all(mode == (True, False) for mode in model.modes)  # inference_mode, not training
    stages, total = server_timing_durations(rs[0].headers["server-timing"])
    assert {"queue", "validate", "preprocess", "to_device", "infer", "to_host", "postprocess", "serialize"} <= set(stages)
    assert total >= stages["infer"]
    rep = app.recorder.report()
    assert rep.latency["count"] == 3


def test_warm_up_runs_each_batch_size_before_ready():
    model = Doubler()
    app = servescope.serve(model, max_batch_size=6)

    async def go():
        await app.startup()
        await app.wait_ready()

    run(go())
    assert model.batch_sizes[:4] == [1, 2, 4, 6]
    assert app.info["warmup_batch_sizes"] == [1, 2, 4, 6]
    assert set(model.batch_sizes[4:]) == {1}  # then a lone item is timed (inline or not)
    run(app.shutdown())


def test_health_answers_at_once_and_ready_only_after_loading():
    release = threading.Event()

    class Slow(Doubler):
        def load(self, device):
            release.wait(10)
            return super().load(device)

    app = servescope.serve(Slow())

    async def go():
        await app.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            health = await client.get("/health")
            ready_before = await client.get("/ready")
            predict_before = await client.post("/predict", json={"x": [1, 2, 3, 4]})
            release.set()
            await app.wait_ready()
            ready_after = await client.get("/ready")
        await app.shutdown()
        return health, ready_before, predict_before, ready_after

    health, before, predict_before, after = run(go())
    assert health.status_code == 200
    assert before.status_code == 503 and before.json()["ready"] is False
    assert predict_before.status_code == 503 and predict_before.headers["retry-after"] == "1"
    assert after.status_code == 200


def test_concurrent_requests_are_batched():
    gate = threading.Event()
    model = Doubler(gate)
    app = servescope.serve(model, max_batch_size=8, inline_below_ms=0)  # the worker path throughout

    async def go():
        async with Running(app) as client:
            first = asyncio.ensure_future(client.post("/predict", json={"x": [1, 1, 1, 1]}))
            while not model.served and app.batcher.depth() == 0 and not first.done():
                await asyncio.sleep(0.005)
                if len(model.modes) >= 4 and app.batcher.batches >= 1:
                    break
            rest = [asyncio.ensure_future(client.post("/predict", json={"x": [i, 0, 0, 0]})) for i in range(6)]
            await until(lambda: app.batcher.depth() >= 6)
            gate.set()
            return await first, await asyncio.gather(*rest)

    first, rest = run(go())
    assert first.status_code == 200 and all(r.status_code == 200 for r in rest)
    assert [r.json()["y"][0] for r in rest] == [2.0 * i for i in range(6)]  # each got its own answer
    assert model.served == [1, 6]  # the lone first did not wait; the six went as one


@pytest.mark.parametrize(
    "content, status, message",
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"x": [1, 2]}', 422, "x needs 4 numbers"),
        (b'{"y": 1}', 422, "missing field 'x'"),
        (b'{"x": [' + b"1," * 600_000 + b"1]}", 413, "request body over"),
    ],
)
def test_bad_requests_get_a_4xx_that_says_why(content, status, message):
    app = servescope.serve(Doubler())

    async def go():
        async with Running(app) as client:
            bad = await client.post("/predict", content=content)
            good = await client.post("/predict", json={"x": [1, 2, 3, 4]})
        return bad, good

    bad, good = run(go())
    assert bad.status_code == status and message in bad.json()["error"]
    assert good.status_code == 200  # and the server keeps serving


def test_routes_and_methods():
    app = servescope.serve(Doubler())

    async def go():
        async with Running(app) as client:
            return await client.get("/predict"), await client.get("/nope")

    wrong_method, missing = run(go())
    assert wrong_method.status_code == 405 and missing.status_code == 404


def test_one_items_failure_is_that_items_only():
    model = Doubler()
    app = servescope.serve(model, max_batch_size=8)

    async def go():
        async with Running(app) as client:
            payloads = [[1, 1, 1, 1], [-1, 0, 0, 0], [-2, 0, 0, 0], [-3, 0, 0, 0], [2, 2, 2, 2]]
            return await asyncio.gather(*(client.post("/predict", json={"x": p}) for p in payloads))

    ok1, bad_pre, poisoned, bad_post, ok2 = run(go())
    assert ok1.status_code == 200 and ok2.status_code == 200
    assert bad_pre.status_code == 500 and bad_pre.json()["error"] == "internal error in the model's preprocess"
    assert poisoned.status_code == 500 and poisoned.json()["error"] == "internal error in the model's forward"
    assert bad_post.status_code == 500 and bad_post.json()["error"] == "internal error in the model's postprocess"
    assert ok2.json()["y"] == [4.0, 4.0, 4.0, 4.0]


def test_a_full_queue_answers_503_at_once_and_a_deadline_504():
    gate = threading.Event()
    model = Doubler(gate)
    # (the watchdog kept off: a worker started beside the stuck batch would take the queued
    # requests, and on a slow machine the test waited for a queue that never filled)
    app = servescope.serve(model, max_queue=2, timeout_s=0.3, batch_timeout_s=60.0, inline_below_ms=0)

    async def go():
        async with Running(app) as client:
            stuck = asyncio.ensure_future(client.post("/predict", json={"x": [1, 1, 1, 1]}))
            await until(lambda: app.batcher.batches >= 1)
            queued = [asyncio.ensure_future(client.post("/predict", json={"x": [1, 1, 1, 1]})) for _ in range(2)]
            await until(lambda: app.batcher.depth() >= 2)
            shed = await client.post("/predict", json={"x": [1, 1, 1, 1]})
            timed_out = await stuck
            gate.set()
            return shed, timed_out, await asyncio.gather(*queued)

    shed, timed_out, queued = run(go())
    assert shed.status_code == 503 and shed.headers["retry-after"] == "1" and "queue is full" in shed.json()["error"]
    assert timed_out.status_code == 504
    assert {r.status_code for r in queued} <= {200, 504}
    rep = app.recorder.report()
    assert rep.errors.get("HTTP 503") == 1


def test_a_client_that_leaves_frees_its_slot():
    gate = threading.Event()
    model = Doubler(gate)
    app = servescope.serve(model, inline_below_ms=0)

    async def go():
        await app.startup()
        await app.wait_ready()
        model.serving = True
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            stuck = asyncio.ensure_future(client.post("/predict", json={"x": [1, 1, 1, 1]}))
            await until(lambda: app.batcher.batches >= 1)
            # a second request that waits in the queue, then its client disconnects
            messages = [{"type": "http.request", "body": b'{"x": [5, 5, 5, 5]}', "more_body": False}]
            left = asyncio.Event()

            async def receive():
                if messages:
                    return messages.pop()
                await left.wait()
                return {"type": "http.disconnect"}

            sent = []

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": "/predict", "headers": [], "query_string": b""}
            call = asyncio.ensure_future(app(scope, receive, send))
            await until(lambda: app.batcher.depth() >= 1)
            left.set()
            await call
            gate.set()
            await stuck
        await app.shutdown()
        return sent

    sent = run(go())
    assert sent == []  # nobody to answer
    assert model.served == [1]  # the stuck one only: the departed item was skipped


def test_msgpack_when_the_client_asks_for_it():
    app = servescope.serve(Doubler())

    async def go():
        async with Running(app) as client:
            return await client.post("/predict", json={"x": [1, 2, 3, 4]}, headers={"Accept": "application/msgpack"})

    r = run(go())
    assert r.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(r.content) == {"y": [2.0, 4.0, 6.0, 8.0]}


def test_metrics_expose_stages_batches_queue_and_statuses():
    app = servescope.serve(Doubler())

    async def go():
        async with Running(app) as client:
            await client.post("/predict", json={"x": [1, 2, 3, 4]})
            await client.post("/predict", content=b"nope")
            return await client.get("/metrics")

    r = run(go())
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {"servescope_stage_seconds", "servescope_batch_size", "servescope_queue_depth", "servescope_requests"} <= set(fams)
    statuses = {s.labels["status"]: s.value for s in fams["servescope_requests"].samples if s.name.endswith("_total")}
    assert statuses == {"200": 1.0, "400": 1.0}
    [threads] = fams["servescope_torch_threads"].samples  # the choice, and where it came from
    assert threads.value >= 1 and threads.labels["source"] in ("--threads", "OMP_NUM_THREADS", "the CPUs available")


def test_the_users_own_thread_count_is_kept(monkeypatch):
    from servescope.serve.runtime import thread_choice

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_choice(None, 8.0) == (3, "OMP_NUM_THREADS")
    assert thread_choice(2, 8.0) == (2, "--threads")  # --threads first
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert thread_choice(None, 8.0) == (8, "the CPUs available")


def test_a_failing_load_is_reported_not_hidden():
    class Broken(Doubler):
        def load(self, device):
            raise OSError("weights.pt not found")

    app = servescope.serve(Broken())

    async def go():
        await app.startup()
        await app.wait_ready()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/ready"), await client.post("/predict", json={"x": [1, 2, 3, 4]})

    ready, predict = run(go())
    assert ready.status_code == 503 and "weights.pt not found" in ready.json()["error"]  # the operator's view
    assert predict.status_code == 500 and "see the server log" in predict.json()["error"]
    assert "weights.pt" not in predict.text  # a client's view: no paths


@pytest.mark.parametrize(
    "model, kwargs, match",
    [
        (Doubler, {}, "add the brackets"),
        (object(), {}, "servescope.Model subclass"),
        (Doubler(), {"max_batch_size": 0}, "max_batch_size"),
        (Doubler(), {"max_wait_ms": -1}, "max_wait_ms"),
        (Doubler(), {"timeout_s": 0}, "timeout_s"),
        (Doubler(), {"inline_below_ms": -1}, "inline_below_ms"),
    ],
)
def test_bad_configuration_is_refused_at_construction(model, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        servescope.serve(model, **kwargs)


# -- the batcher alone: deterministic, no threads, no sleeping ---------------------------------


def test_batcher_takes_what_is_queued_up_to_the_limit_without_waiting():
    b = Batcher(lambda items: None, max_batch_size=4)
    items = [Item(i) for i in range(6)]
    for it in items:
        assert b.submit(it)
    assert [it.payload for it in b.next_batch(block=False)] == [0, 1, 2, 3]
    assert [it.payload for it in b.next_batch(block=False)] == [4, 5]
    assert b.next_batch(block=False) == []


def test_batcher_skips_cancelled_items_and_stops_on_the_sentinel():
    b = Batcher(lambda items: None, max_batch_size=4, max_queue=3)
    a, c, d = Item("a"), Item("c"), Item("d")
    assert b.submit(a) and b.submit(c) and b.submit(d)
    assert not b.submit(Item("over"))  # bounded
    a.cancelled = True
    b.stop(timeout=0)
    assert [it.payload for it in b.next_batch()] == ["c", "d"]
    assert b.next_batch() is None


def test_batcher_with_max_wait_collects_late_items_by_its_clock():
    now = [0]
    b = Batcher(lambda items: None, max_batch_size=4, max_wait_ms=5, clock=lambda: now[0])
    b.submit(Item(1))
    now[0] = 10_000_000  # the wait is already over by this clock: it does not block
    assert [it.payload for it in b.next_batch(block=False)] == [1]


def test_report_route_gives_the_served_figures_and_load_now_makes_startup_skip_loading():
    model = Doubler()
    app = servescope.serve(model, timing_suffix=', replica;desc="r1"')
    assert app.load_now() == "ready"  # a host that decides readiness itself (a Ray replica)

    async def go():
        async with Running(app) as client:
            r = await client.post("/predict", json={"x": [1, 2, 3, 4]})
            return r, await client.get("/report")

    r, rep = run(go())
    assert model.loads == 1  # startup() did not load a second time
    assert r.headers["server-timing"].endswith(', replica;desc="r1"')
    body = rep.json()
    assert body["schema"].startswith("servescope.report/") and body["latency"]["count"] == 1
    assert "infer" in body["stages"] and "total" in body["distributions"]  # mergeable elsewhere


class ThreadSpy(Doubler):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.queued = None  # when set: the worker's first batch waits until this says the rest queued

    def infer(self, batch):
        if self.serving:
            self.threads.append(threading.current_thread().name)
            if self.queued is not None and threading.current_thread().name == "servescope-worker":
                queued, self.queued = self.queued, None
                wait_until(lambda: queued(batch.shape[0]))
        return super().infer(batch)


def wait_until(condition, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.001)


def test_a_lone_request_on_a_fast_model_runs_inline_and_concurrent_ones_batch_on_the_worker():
    model = ThreadSpy()
    app = servescope.serve(model, max_batch_size=8, inline_below_ms=5)  # opted in: unbounded on the loop

    async def go():
        async with Running(app) as client:
            lone = [await client.post("/predict", json={"x": [1, 2, 3, 4]}) for _ in range(3)]
            inline_threads = list(model.threads)
            # the worker's first batch holds until the other five have queued behind it, as
            # they do when a real model takes longer than the loop needs to read five requests
            model.queued = lambda in_batch: in_batch + app.batcher.depth() >= 6
            together = await asyncio.gather(*(client.post("/predict", json={"x": [i, 0, 0, 0]}) for i in range(6)))
            return lone, inline_threads, together

    lone, inline_threads, together = run(go())
    assert app.info["inline"] is True
    assert all(r.status_code == 200 for r in lone + together)
    assert lone[0].json() == {"y": [2.0, 4.0, 6.0, 8.0]}
    assert inline_threads == [threading.current_thread().name] * 3  # the event loop's thread: no hand-off
    stages, _ = server_timing_durations(lone[0].headers["server-timing"])
    assert {"queue", "preprocess", "infer", "postprocess", "serialize"} <= set(stages)
    # requests that arrive together are not run one by one on the loop: they batch on the worker
    assert [r.json()["y"][0] for r in together] == [2.0 * i for i in range(6)]
    assert set(model.threads[3:]) == {"servescope-worker"}
    assert max(model.served[3:]) > 1


def test_a_model_slower_than_inline_below_ms_always_goes_to_the_worker():
    model = ThreadSpy()
    app = servescope.serve(model, inline_below_ms=0.000001)

    async def go():
        async with Running(app) as client:
            return [await client.post("/predict", json={"x": [1, 2, 3, 4]}) for _ in range(2)]

    assert all(r.status_code == 200 for r in run(go()))
    assert app.info["inline"] is False
    assert model.threads == ["servescope-worker"] * 2


def test_report_is_built_at_most_once_per_interval_however_often_it_is_scraped():
    app = servescope.serve(Doubler(), report_interval_s=5.0)
    built = []
    source = app.report_source
    app.report_source = lambda: built.append(1) or source()
    now = [100.0]
    app._now = lambda: now[0]  # the app's clock, by hand

    async def go():
        async with Running(app) as client:
            await client.post("/predict", json={"x": [1, 2, 3, 4]})
            first = await asyncio.gather(*(client.get("/report") for _ in range(20)))  # at once
            again = await client.get("/report")
            await client.post("/predict", json={"x": [1, 2, 3, 4]})
            now[0] += 5.0
            later = await client.get("/report")
            return first, again, later

    first, again, later = run(go())
    assert [r.status_code for r in first] == [200] * 20 and again.status_code == 200
    assert len(built) == 2  # once for the 21 scrapes, once after the interval
    assert {r.content for r in first} == {again.content} and first[0].json()["latency"]["count"] == 1
    assert later.json()["latency"]["count"] == 2


@pytest.mark.parametrize("bad", [-1, "1s"])
def test_a_bad_report_interval_is_refused(bad):
    with pytest.raises(ConfigError, match="report_interval_s"):
        servescope.serve(Doubler(), report_interval_s=bad)


def test_errors_stay_private_the_log_has_them_under_the_request_id(caplog):
    class Leaky(Doubler):
        def validate(self, payload):
            if payload.get("db"):
                raise ConnectionError("postgres://admin:hunter2@db.internal/prod refused")
            return super().validate(payload)

        def preprocess(self, item):
            if item[0] == -9:
                raise RuntimeError("secret token=sk-LIVE-123456 in /home/alice/models/ckpt.pt")
            return super().preprocess(item)

    app = servescope.serve(Leaky(), inline_below_ms=0)

    async def go():
        async with Running(app) as client:
            return await client.post("/predict", json={"x": [-9, 0, 0, 0]}), await client.post("/predict", json={"db": 1, "x": [1, 1, 1, 1]})

    with caplog.at_level("WARNING", logger="servescope"):
        boom, refused = run(go())
    assert boom.status_code == 500 and "sk-LIVE" not in boom.text and "/home/alice" not in boom.text
    rid = boom.json()["request_id"]
    assert boom.headers["x-request-id"] == rid
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and "sk-LIVE-123456" in logged[0].getMessage() and logged[0].exc_info is not None  # the traceback
    assert refused.status_code == 422 and "hunter2" not in refused.text
    assert refused.json()["error"] == "invalid payload: rejected by validate() (ConnectionError)"
    assert any("hunter2" in r.getMessage() and refused.json()["request_id"] in r.getMessage() for r in caplog.records)


def test_debug_errors_puts_the_text_in_the_body():
    class Failing(Doubler):
        def preprocess(self, item):
            if item[0] == 1:  # not the warm-up example
                raise RuntimeError("the detail")
            return super().preprocess(item)

    app = servescope.serve(Failing(), debug_errors=True, inline_below_ms=0)

    async def go():
        async with Running(app) as client:
            return await client.post("/predict", json={"x": [1, 1, 1, 1]})

    r = run(go())
    assert r.status_code == 500 and r.json()["error"] == "internal error in the model's preprocess: RuntimeError: the detail"


def test_nan_in_an_output_is_an_error_not_a_silent_null():
    class NaNs(Doubler):
        def postprocess(self, output):
            y = output.numpy()
            if y[0] == 8.0:
                y = y * float("nan")
            return {"y": y}

    app = servescope.serve(NaNs(), inline_below_ms=0)

    async def go():
        async with Running(app) as client:
            return await client.post("/predict", json={"x": [4, 0, 0, 0]}), await client.post("/predict", json={"x": [1, 0, 0, 0]})

    nan, fine = run(go())
    assert nan.status_code == 500 and nan.json()["error"] == "internal error in the model's serialize"
    assert fine.status_code == 200 and fine.json()["y"][0] == 2.0


def test_a_declared_body_over_the_limit_is_refused_before_reading_and_the_connection_closed():
    app = servescope.serve(Doubler(), max_body_bytes=1024)
    reads, sent = [], []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    async def send(message):
        sent.append(message)

    async def go():
        await app.startup()
        await app.wait_ready()
        scope = {"type": "http", "method": "POST", "path": "/predict", "headers": [(b"content-length", b"10000000000")]}
        await app(scope, receive, send)

    run(go())
    start = sent[0]
    assert start["status"] == 413 and (b"connection", b"close") in start["headers"]
    assert reads == []  # a 10 GB declared body: not one byte read


# -- supervision: a model that never returns is a stuck worker, not an outage ------------------


def test_by_default_no_model_code_runs_on_the_event_loop():
    class Validating(ThreadSpy):
        def validate(self, payload):
            if self.serving:
                self.threads.append("validate on " + threading.current_thread().name)
            return super().validate(payload)

    model = Validating()
    app = servescope.serve(model)

    async def go():
        async with Running(app) as client:
            ok = [await client.post("/predict", json={"x": [1, 2, 3, 4]}) for _ in range(3)]
            return ok, await client.post("/predict", json={"x": [1]})

    ok, bad = run(go())
    assert all(r.status_code == 200 for r in ok) and ok[0].json() == {"y": [2.0, 4.0, 6.0, 8.0]}
    assert bad.status_code == 422 and bad.json()["error"] == "invalid payload: x needs 4 numbers"  # as before
    assert app.info["inline"] is False
    assert set(model.threads) == {"servescope-worker", "validate on servescope-worker"}  # never the loop's thread
    stages, _ = server_timing_durations(ok[0].headers["server-timing"])
    assert {"receive", "validate", "queue", "preprocess", "infer"} <= set(stages)


def test_a_stuck_batch_gets_its_worker_replaced_and_ready_says_why():
    gate = threading.Event()  # the first forward once serving blocks until the test opens it
    model = Doubler(gate=gate)
    app = servescope.serve(model, timeout_s=0.5, batch_timeout_s=2.0)

    async def go():
        async with Running(app) as client:
            stuck = await client.post("/predict", json={"x": [1, 2, 3, 4]})  # its deadline passes: 504
            assert app.check_stuck() is False  # the batch has not outlived batch_timeout_s yet
            started = app.batcher.batch_started_ns
            assert app.check_stuck(now_ns=started + 2_100_000_000) is True  # 2.1 s in: stuck
            model.gate = None  # the next forwards do not block
            after = await client.post("/predict", json={"x": [1, 0, 0, 0]})
            ready = await client.get("/ready")
            metrics = await client.get("/metrics")
            gate.set()  # the abandoned thread wakes: its late answer goes nowhere
            return stuck, after, ready, metrics

    stuck, after, ready, metrics = run(go())
    assert stuck.status_code == 504
    assert after.status_code == 200 and after.json() == {"y": [2.0, 0.0, 0.0, 0.0]}  # served by the new worker
    body = ready.json()
    assert ready.status_code == 200 and body["worker_replacements"] == 1 and "batch_timeout_s=2" in body["stuck"]
    assert "servescope_worker_replacements_total 1.0" in metrics.text
    assert "process_resident_memory_bytes" in metrics.text  # growth per request is visible


def test_a_model_that_hangs_every_worker_fails_ready_for_good():
    app = servescope.serve(Doubler(), batch_timeout_s=1.0)
    app.state = "ready"
    from servescope.serve.app import MAX_REPLACEMENTS

    for _ in range(MAX_REPLACEMENTS):
        app.batcher.batch_started_ns = 0  # each new worker stuck at once, as the old one was
        assert app.check_stuck(now_ns=1_500_000_000) is True and app.state == "ready"
    app.batcher.batch_started_ns = 0
    assert app.check_stuck(now_ns=1_500_000_000) is True
    assert app.state == "failed" and "not replaced again" in app.failure


def test_a_field_the_request_lacks_in_preprocess_is_a_422_not_a_500():
    class Picky(Doubler):
        def validate(self, payload):
            return payload  # no checks here: preprocess reads the fields

        def preprocess(self, item):
            return torch.tensor(item["x"], dtype=torch.float32) * item.get("scale", 1)

    app = servescope.serve(Picky(), example={"x": [0.0] * 4})

    async def go():
        async with Running(app) as client:
            return await client.post("/predict", json={"y": [1, 2, 3, 4]}), await client.post("/predict", json={"x": [1, 2, 3, 4]})

    missing, ok = run(go())
    assert missing.status_code == 422 and missing.json()["error"] == "invalid payload: missing field 'x'"
    assert ok.status_code == 200 and ok.json() == {"y": [2.0, 4.0, 6.0, 8.0]}


def test_a_route_of_the_runtimes_own_or_a_method_without_a_body_is_refused():
    with pytest.raises(ConfigError, match="not be one of the runtime's own routes"):
        servescope.serve(Doubler(), path="/health")
    with pytest.raises(ConfigError, match="methods must be among POST, PUT, PATCH"):
        servescope.serve(Doubler(), methods=("GET",))
