from __future__ import annotations

import asyncio
import io
import time

import httpx
import pytest
from fastapi import BackgroundTasks, FastAPI
from fastapi.responses import StreamingResponse
from flask import Flask, jsonify, request

import servescope
from servescope.exceptions import ConfigError
from servescope.exporters import JsonLinesExporter
from servescope.middleware import ServescopeMiddleware, ServescopeWSGIMiddleware
from servescope.servertiming import server_timing_durations


def fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post("/predict")
    async def predict(payload: dict):
        with servescope.stage("preprocess"):
            words = payload["text"].split()
        with servescope.stage("infer"):
            await asyncio.sleep(0.002)
        return {"n": len(words)}

    @app.get("/stream")
    async def stream():
        async def gen():
            for i in range(3):
                with servescope.stage("infer"):
                    await asyncio.sleep(0.001)
                yield f"{i}\n".encode()

        return StreamingResponse(gen())

    @app.post("/background")
    async def background(tasks: BackgroundTasks):
        ran = app.state.ran = []
        tasks.add_task(lambda: ran.append(servescope.current_trace()))
        return {"ok": True}

    @app.get("/boom")
    async def boom():
        raise RuntimeError("model exploded")

    @app.get("/missing")
    async def missing():
        from fastapi import HTTPException

        raise HTTPException(404, "no such item")

    return app


async def call(app, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, **kw)


def test_asgi_request_gets_a_trace_a_header_and_a_record():
    app = fastapi_app()
    recorder = servescope.Recorder()
    app.add_middleware(ServescopeMiddleware, recorder=recorder)
    r = asyncio.run(call(app, "POST", "/predict", json={"text": "a b c"}))
    assert r.status_code == 200 and r.json() == {"n": 3}
    stages, total = server_timing_durations(r.headers["server-timing"])
    assert {"receive", "preprocess", "infer"} <= set(stages)
    assert stages["infer"] >= 1.5  # the 2 ms sleep
    assert total >= stages["infer"]
    rep = recorder.report()
    assert rep.latency["count"] == 1
    assert {"receive", "preprocess", "infer", "send"} <= set(rep.stages)


def test_streaming_responses_are_timed_to_the_last_chunk():
    mw = ServescopeMiddleware(fastapi_app())
    r = asyncio.run(call(mw, "GET", "/stream"))
    assert r.text == "0\n1\n2\n"
    rep = mw.recorder.report()
    assert rep.stages["infer"]["count"] == 1
    assert rep.stages["infer"]["mean_ms"] >= 2.5  # three 1 ms sleeps, summed
    assert "receive" not in rep.stages or rep.stages["receive"]["max_ms"] < 1.0  # no disconnect wait


def test_a_streamed_body_from_a_decorated_generator_counts_its_stage():
    @servescope.stage("postprocess")
    def lines():  # a plain generator: Starlette iterates it in its thread pool
        for i in range(3):
            time.sleep(0.005)
            yield f"{i}\n"

    @servescope.stage("postprocess")
    async def alines():
        for i in range(3):
            time.sleep(0.005)  # CPU-bound work making each chunk
            yield f"{i}\n"

    app = FastAPI()
    app.get("/sync")(lambda: StreamingResponse(lines()))
    app.get("/async")(lambda: StreamingResponse(alines()))
    mw = ServescopeMiddleware(app)
    for path in ("/sync", "/async"):
        assert asyncio.run(call(mw, "GET", path)).text == "0\n1\n2\n"
    rep = mw.recorder.report()
    assert rep.stages["postprocess"]["count"] == 2
    assert rep.stages["postprocess"]["p50_ms"] >= 14.0  # three 5 ms chunks each, not the generator's creation


def test_background_tasks_still_run_after_the_trace_ends():
    app = fastapi_app()
    mw = ServescopeMiddleware(app)
    r = asyncio.run(call(mw, "POST", "/background"))
    assert r.json() == {"ok": True}
    assert len(app.state.ran) == 1
    assert mw.recorder.report().latency["count"] == 1


def test_failures_are_recorded_as_errors_not_latency():
    mw = ServescopeMiddleware(fastapi_app())  # outside FastAPI's own 500 handler: sees the exception
    assert asyncio.run(call(mw, "GET", "/boom")).status_code == 500
    assert asyncio.run(call(mw, "GET", "/missing")).status_code == 404
    rep = mw.recorder.report()
    assert rep.errors == {"RuntimeError": 1, "HTTP 404": 1}
    assert rep.latency["count"] == 0


def test_sampling_zero_traces_nothing_and_sends_no_header():
    mw = ServescopeMiddleware(fastapi_app(), sample_rate=0.0)
    r = asyncio.run(call(mw, "POST", "/predict", json={"text": "x"}))
    assert r.status_code == 200 and "server-timing" not in r.headers
    assert len(mw.recorder) == 0


def test_excluded_paths_are_not_traced():
    mw = ServescopeMiddleware(fastapi_app(), exclude_paths=["/stream"])
    r = asyncio.run(call(mw, "GET", "/stream"))
    assert "server-timing" not in r.headers


@pytest.mark.parametrize("rate", [-0.1, 1.5, "all"])
def test_bad_sample_rate_is_refused(rate):
    with pytest.raises(ConfigError, match="sample_rate"):
        ServescopeMiddleware(fastapi_app(), sample_rate=rate)


def flask_app() -> Flask:
    app = Flask(__name__)

    @app.post("/predict")
    def predict():
        with servescope.stage("validate"):
            payload = request.get_json()
        with servescope.stage("infer"):
            n = len(payload["text"].split())
        with servescope.stage("serialize"):
            return jsonify(n=n)

    @app.get("/fail")
    def fail():
        raise ValueError("bad")

    @app.get("/stream")
    def stream():
        return app.response_class((f"{i}\n" for i in range(3)), mimetype="text/plain")

    return app


def test_wsgi_request_gets_a_trace_a_header_and_a_record(tmp_path):
    app = flask_app()
    log = io.BytesIO()
    app.wsgi_app = mw = ServescopeWSGIMiddleware(app.wsgi_app, exporters=[JsonLinesExporter(log)])
    client = app.test_client()
    r = client.post("/predict", json={"text": "a b"})
    assert r.status_code == 200 and r.get_json() == {"n": 2}
    stages, total = server_timing_durations(r.headers["Server-Timing"])
    assert {"receive", "validate", "infer", "serialize"} <= set(stages)
    r.close()  # WSGI servers close the body once written: that ends the request
    streamed = client.get("/stream")
    assert streamed.data == b"0\n1\n2\n"
    streamed.close()
    rep = mw.recorder.report()
    assert rep.latency["count"] == 2
    assert "send" in rep.stages
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and b'"path":"/predict"' in lines[0] and b'"status":200' in lines[0]


def test_a_wsgi_streamed_body_runs_in_the_request_and_its_writes_are_send():
    @servescope.stage("postprocess")
    def lines():
        for i in range(3):
            time.sleep(0.005)
            yield f"{i}\n"

    @servescope.stage("postprocess")
    def broken():
        yield "0\n"
        raise RuntimeError("stream broke")

    app = Flask(__name__)
    app.add_url_rule("/stream", "stream", lambda: app.response_class(lines(), mimetype="text/plain"))
    app.add_url_rule("/broken", "broken", lambda: app.response_class(broken(), mimetype="text/plain"))
    app.wsgi_app = mw = ServescopeWSGIMiddleware(app.wsgi_app)
    client = app.test_client()
    r = client.get("/stream")
    assert r.data == b"0\n1\n2\n"
    r.close()
    stages = mw.recorder.report().stages
    assert stages["postprocess"]["p50_ms"] >= 14.0  # the chunks were made inside the request
    assert stages["send"]["p50_ms"] < stages["postprocess"]["p50_ms"]  # making them is not sending them
    with pytest.raises(RuntimeError, match="stream broke"):
        client.get("/broken").data
    assert mw.recorder.report().errors == {"RuntimeError": 1}


def test_wsgi_failure_is_recorded():
    app = flask_app()
    app.wsgi_app = mw = ServescopeWSGIMiddleware(app.wsgi_app)
    r = app.test_client().get("/fail")
    assert r.status_code == 500
    r.close()  # the server closes the body: that ends the request
    assert mw.recorder.report().errors == {"HTTP 500": 1}


def own_timing_app(value: bytes, *, headers=None):
    """An ASGI app that times itself and says so in its own Server-Timing header."""

    async def app(scope, receive, send):
        await receive()
        sent = headers() if headers else [(b"content-type", b"application/json"), (b"server-timing", value)]
        await send({"type": "http.response.start", "status": 200, "headers": sent})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def timing(r: httpx.Response) -> tuple[dict[str, float], float | None]:
    """What a client reads: every Server-Timing line, joined."""
    return server_timing_durations(", ".join(r.headers.get_list("server-timing")))


def test_an_apps_own_server_timing_is_adopted_not_duplicated():
    mw = ServescopeMiddleware(own_timing_app(b"queue;dur=2, infer;dur=5, total;dur=7.5"))
    r = asyncio.run(call(mw, "POST", "/predict", content=b"{}"))
    lines = r.headers.get_list("server-timing")
    assert lines[0] == "queue;dur=2, infer;dur=5, total;dur=7.5"  # the app's, as it sent it
    stages, total = timing(r)
    assert stages["infer"] == 5 and stages["queue"] == 2 and total == 7.5  # each name once
    assert "receive" in stages  # what only the middleware measured is added
    rep = mw.recorder.report()
    assert rep.stages["infer"]["mean_ms"] == 5


def test_an_apps_own_server_timing_passes_through_untouched():
    own = b'cache;desc="hit", db;dur=2.5;desc="primary"'
    mw = ServescopeMiddleware(own_timing_app(own))
    r = asyncio.run(call(mw, "POST", "/predict", content=b"{}"))
    lines = r.headers.get_list("server-timing")
    assert lines[0] == own.decode()  # desc values and duration-less metrics kept (were dropped)
    assert len(lines) == 2 and "db;" not in lines[1] and "total;dur=" in lines[1]
    assert mw.recorder.report().stages["db"]["mean_ms"] == 2.5


@pytest.mark.parametrize("own", [b"db;dur=1e308, db;dur=1e308", b"db;dur=1e13", b"db;dur=abc", b"\xff;;;"])
def test_bad_server_timing_from_the_app_never_breaks_its_response(own):
    mw = ServescopeMiddleware(own_timing_app(own))
    r = asyncio.run(call(mw, "POST", "/predict", content=b"{}"))
    assert r.status_code == 200 and r.content == b"{}"  # 1e308 twice turned the 200 into a 500
    assert r.headers.get_list("server-timing")[0].encode("latin-1") == own
    assert mw.recorder.report().latency["count"] == 1


def test_response_headers_may_be_any_iterable():
    def generated():  # valid ASGI: an iterable of pairs, here one that can be read only once
        yield (b"content-type", b"text/plain")
        yield (b"x-app", b"1")
        yield (b"server-timing", b"infer;dur=3")

    for make in (generated, lambda: tuple(generated()), lambda: [[k, v] for k, v in generated()]):
        mw = ServescopeMiddleware(own_timing_app(b"", headers=make))
        r = asyncio.run(call(mw, "POST", "/predict", content=b"{}"))
        assert r.headers["x-app"] == "1" and r.headers["content-type"] == "text/plain"  # were all dropped
        assert timing(r)[0]["infer"] == 3


def test_an_apps_own_metrics_route_wins_over_the_exporters():
    from servescope.exporters import PrometheusExporter

    app = FastAPI()
    app.get("/metrics")(lambda: {"mine": True})
    app.post("/predict")(lambda: {})
    mw = ServescopeMiddleware(app, exporters=[PrometheusExporter()])
    assert asyncio.run(call(mw, "GET", "/metrics")).json() == {"mine": True}
    other = ServescopeMiddleware(fastapi_app(), exporters=[PrometheusExporter()])  # no /metrics of its own
    r = asyncio.run(call(other, "GET", "/metrics"))
    assert r.status_code == 200 and "servescope_stage_seconds" in r.text


def test_wsgi_the_apps_own_server_timing_and_metrics_route_are_its_own():
    from servescope.exporters import PrometheusExporter

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/metrics":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"mine"]
        headers = (h for h in [("Content-Type", "text/plain"), ("Server-Timing", 'db;dur=2.5;desc="primary", x;dur=1e308')])
        start_response("200 OK", headers)  # a generator of headers: not PEP 3333's list, but seen
        return [b"ok"]

    def no_metrics(environ, start_response):
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"nope"]

    from werkzeug.test import Client

    client = Client(ServescopeWSGIMiddleware(app, exporters=[PrometheusExporter()]))
    r = client.get("/predict")
    assert r.status_code == 200 and r.data == b"ok" and r.headers["Content-Type"] == "text/plain"
    lines = r.headers.getlist("Server-Timing")
    assert lines[0] == 'db;dur=2.5;desc="primary", x;dur=1e308' and "total;dur=" in lines[1]
    r.close()
    assert client.get("/metrics").data == b"mine"
    r = Client(ServescopeWSGIMiddleware(no_metrics, exporters=[PrometheusExporter()])).get("/metrics")
    assert r.status_code == 200 and b"servescope_stage_seconds" in r.data


def test_wsgi_metrics_route_of_an_app_that_starts_its_response_with_the_first_chunk():
    from werkzeug.test import Client

    from servescope.exporters import PrometheusExporter

    def lazy(status):
        def app(environ, start_response):  # PEP 3333 allows start_response at the first chunk
            start_response(status, [("Content-Type", "text/plain")])
            yield b"mine"

        return app

    r = Client(ServescopeWSGIMiddleware(lazy("200 OK"), exporters=[PrometheusExporter()])).get("/metrics")
    assert r.status_code == 200 and r.data == b"mine"
    r = Client(ServescopeWSGIMiddleware(lazy("404 Not Found"), exporters=[PrometheusExporter()])).get("/metrics")
    assert r.status_code == 200 and b"servescope_stage_seconds" in r.data


def _families(text: str) -> dict[str, dict]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: {tuple(sorted(s.labels.items())) + (s.name,): s.value for s in f.samples} for f in text_string_to_metric_families(text)}


def test_one_line_serves_metrics_from_its_recorder_at_scrape_time():
    mw = ServescopeMiddleware(fastapi_app())  # no exporter: the README's one line
    for _ in range(3):
        assert asyncio.run(call(mw, "POST", "/predict", json={"text": "a b"})).status_code == 200
    r = asyncio.run(call(mw, "GET", "/metrics"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = _families(r.text)
    infer = fams["servescope_stage_seconds"][(("stage", "infer"), "servescope_stage_seconds_count")]
    assert infer == 3  # the three requests the recorder saw, computed when scraped
    assert fams["servescope_requests"][(("status", "200"), "servescope_requests_total")] == 3
    assert "server-timing" not in r.headers and len(mw.recorder.latency) == 3  # /metrics is not traced


def test_metrics_path_none_keeps_no_metrics_and_another_path_moves_it():
    off = ServescopeMiddleware(fastapi_app(), metrics_path=None)
    assert off.metrics is None
    assert asyncio.run(call(off, "GET", "/metrics")).status_code == 404  # the app's answer
    moved = ServescopeMiddleware(fastapi_app(), metrics_path="/-/metrics")
    assert asyncio.run(call(moved, "GET", "/metrics")).status_code == 404
    assert "servescope_stage_seconds" in asyncio.run(call(moved, "GET", "/-/metrics")).text
    wsgi = ServescopeWSGIMiddleware(flask_404_app(), metrics_path=None)
    from werkzeug.test import Client

    assert Client(wsgi).get("/metrics").status_code == 404


def flask_404_app():
    def app(environ, start_response):
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"nope"]

    return app


def test_without_prometheus_client_metrics_answers_501_naming_the_extra(monkeypatch):
    import sys

    from werkzeug.test import Client

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    mw = ServescopeMiddleware(fastapi_app())
    r = asyncio.run(call(mw, "GET", "/metrics"))
    assert r.status_code == 501 and "pip install 'servescope[prometheus]'" in r.text
    assert asyncio.run(call(mw, "POST", "/predict", json={"text": "a"})).status_code == 200  # the rest works
    w = Client(ServescopeWSGIMiddleware(flask_404_app())).get("/metrics")
    assert w.status_code == 501 and b"servescope[prometheus]" in w.data


def test_wsgi_one_line_serves_metrics_from_its_recorder():
    from werkzeug.test import Client

    app = Flask(__name__)
    app.post("/predict")(lambda: jsonify(ok=True))
    app.wsgi_app = ServescopeWSGIMiddleware(app.wsgi_app)
    client = app.test_client()
    client.post("/predict", json={}).close()
    r = client.get("/metrics")
    assert r.status_code == 200
    assert _families(r.text)["servescope_request_seconds"][("servescope_request_seconds_count",)] == 1
