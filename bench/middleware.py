"""What the middleware adds per request, against the bare app, in the same run.

    python bench/middleware.py

Drives ASGI apps in-process (no sockets: the server's own cost would drown the difference)
and reports us per request, median of interleaved repeats, and the added cost over the bare app.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

import servescope
from servescope.exporters import OpenTelemetryExporter, PrometheusExporter
from servescope.middleware import ServescopeMiddleware

N = 3000
REPEATS = 9


async def predict(request):
    await request.body()
    with servescope.stage("preprocess"):
        pass
    with servescope.stage("infer"):
        pass
    return Response(b'{"ok":true}', media_type="application/json")


def bare_app():
    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


SCOPE = {"type": "http", "method": "POST", "path": "/predict", "headers": [], "query_string": b"", "http_version": "1.1"}


async def drive(app, n: int) -> float:
    async def receive():
        return {"type": "http.request", "body": b'{"text":"hi"}', "more_body": False}

    async def send(message):
        pass

    t0 = time.perf_counter_ns()
    for _ in range(n):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter_ns() - t0) / n / 1000


def main() -> None:
    cases = {
        "bare Starlette app": bare_app(),
        "+ ServescopeMiddleware (recorder, Server-Timing)": ServescopeMiddleware(bare_app()),
        "+ middleware, no Server-Timing header": ServescopeMiddleware(bare_app(), server_timing=False),
        "+ middleware, sample_rate=0.1": ServescopeMiddleware(bare_app(), sample_rate=0.1),
        "+ middleware + PrometheusExporter": ServescopeMiddleware(bare_app(), exporters=[PrometheusExporter()]),
        "+ middleware + OpenTelemetryExporter (SDK, no processor)": ServescopeMiddleware(
            bare_app(), exporters=[OpenTelemetryExporter(tracer_provider=TracerProvider())]
        ),
    }
    results: dict[str, list[float]] = {k: [] for k in cases}
    added: dict[str, list[float]] = {k: [] for k in cases}

    async def run() -> None:
        for app in cases.values():
            await drive(app, 200)  # warm-up
        for _ in range(REPEATS):
            base = None
            for name, app in cases.items():
                us = await drive(app, N)
                base = base if base is not None else us
                results[name].append(us)
                added[name].append(us - base)

    asyncio.run(run())
    print(f"servescope {servescope.__version__}: us per request, in-process ASGI (median of {REPEATS} interleaved)")
    base = statistics.median(results["bare Starlette app"])
    for name in cases:
        us = statistics.median(results[name])
        print(f"  {name:<58} {us:7.1f} us   +{statistics.median(added[name]):5.1f} us  ({us / base:4.2f}x)")


if __name__ == "__main__":
    main()
