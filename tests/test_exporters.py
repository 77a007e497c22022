from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import servescope
from servescope import WallClock, stage, trace
from servescope.exporters import JsonLinesExporter, OpenTelemetryExporter, PrometheusExporter
from servescope.middleware import RequestInfo, ServescopeMiddleware


def app_with(exporters) -> ServescopeMiddleware:
    app = FastAPI()

    @app.get("/predict")
    async def predict():
        with servescope.stage("infer"):
            with servescope.stage("to_device"):
                pass
        return {"ok": True}

    return ServescopeMiddleware(app, exporters=exporters)


async def get(app, path):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.get(path)


def test_metrics_scrape_cleanly_with_sub_millisecond_buckets():
    prom = PrometheusExporter()
    app = app_with([prom])
    for _ in range(3):
        asyncio.run(get(app, "/predict"))
    r = asyncio.run(get(app, "/metrics"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    stage_fam = families["servescope_stage_seconds"]
    counts = {
        s.labels["stage"]: s.value for s in stage_fam.samples if s.name.endswith("_count")
    }
    assert counts["infer"] == 3 and counts["to_device"] == 3
    bounds = sorted({float(s.labels["le"]) for s in stage_fam.samples if s.name.endswith("_bucket")})
    assert bounds[0] <= 0.0001  # fast stages are resolved, not lumped under 5 ms
    total = [s for s in families["servescope_requests"].samples if s.name == "servescope_requests_total"]
    assert total[0].labels == {"status": "200"} and total[0].value == 3
    assert "server-timing" not in r.headers  # /metrics itself is not traced


def test_prometheus_label_values_stay_bounded_when_names_are_made_per_request():
    prom = PrometheusExporter(max_stage_names=2)
    for i in range(20):
        prom.observe({f"user_{i}": 1_000_000, "infer": 2_000_000}, 3_000_000, 200)
    body, _ = prom.exposition()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    counts = {
        s.labels["stage"]: s.value for s in families["servescope_stage_seconds"].samples if s.name.endswith("_count")
    }
    assert counts == {"user_0": 1, "user_1": 1, "infer": 20, "(more stages)": 18}


def test_otel_spans_nest_and_reuse_the_trace_timestamps(clock):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    exporter = OpenTelemetryExporter(tracer_provider=provider)
    with trace(clock=WallClock(clock.now)) as t:
        clock.advance(1)
        with stage("infer"):
            clock.advance(2)
            with stage("to_host"):
                clock.advance(0.5)
    exporter.export(t, RequestInfo("POST", "/predict", 200))
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) == {"POST /predict", "infer", "to_host"}
    root, infer, to_host = spans["POST /predict"], spans["infer"], spans["to_host"]
    assert infer.parent.span_id == root.context.span_id
    assert to_host.parent.span_id == infer.context.span_id
    assert root.end_time - root.start_time == 3_500_000
    assert infer.start_time - root.start_time == 1_000_000
    assert infer.end_time - infer.start_time == 2_500_000
    assert root.attributes["http.response.status_code"] == 200


def test_otel_through_the_middleware():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    asyncio.run(get(app_with([OpenTelemetryExporter(tracer_provider=provider)]), "/predict"))
    names = {s.name for s in memory.get_finished_spans()}
    assert {"GET /predict", "infer", "to_device"} <= names


def test_json_lines_to_a_file(tmp_path, clock):
    path = tmp_path / "access.jsonl"
    exporter = JsonLinesExporter(path)
    with trace(clock=WallClock(clock.now)) as t:
        with stage("infer"):
            clock.advance(2)
    exporter.export(t, RequestInfo("POST", "/predict", 200))
    exporter.close()
    row = json.loads(path.read_text())
    assert row["stages"] == {"infer": 2.0} and row["total_ms"] == 2.0 and row["status"] == 200


def test_a_failing_exporter_never_breaks_the_request(caplog):
    class Broken:
        def export(self, trace, info):
            raise RuntimeError("collector down")

    app = app_with([Broken()])
    for _ in range(2):
        assert asyncio.run(get(app, "/predict")).status_code == 200
    assert sum("collector down" in r.getMessage() or "failed" in r.getMessage() for r in caplog.records) == 1
