"""Serving overhead at concurrency 1, without the network: servescope.serve against a naive
FastAPI endpoint, the same tiny model (Linear 4->2, ~10 us), called as ASGI apps in-process.

    python bench/serve_overhead.py

servescope.serve runs twice: as it does by default (the model's code on the batch worker's
thread, never on the event loop) and with ``inline_below_ms=5`` (a lone request on a fast
model runs on the loop: no hand-off, but nothing bounds it; docs/reliability.md).

Each app handles N requests one after another on a uvloop loop (what c=1 is), in
interleaved repeats; the median us/request and the ratio to FastAPI are printed, beside the
bare forward (tensor + forward + tolist) as the floor. What is left is each framework's cost
per request: routing, parsing, validation, the hand-off to the model, serialization, timing.
"""

from __future__ import annotations

import statistics
import time

import orjson
import torch
import uvloop
from fastapi import FastAPI

import servescope

torch.set_num_threads(1)
N, REPEATS = 3000, 9
BODY = orjson.dumps({"x": [1.0, 2.0, 3.0, 4.0]})


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2).eval()


class Tiny(servescope.Model):
    example = {"x": [0.0] * 4}

    def load(self, device):
        return build()

    def validate(self, payload):
        return payload["x"]

    def preprocess(self, item):
        return torch.tensor(item, dtype=torch.float32)

    def postprocess(self, output):
        return {"y": output.numpy()}


def fastapi_app() -> FastAPI:
    model = build()
    app = FastAPI()

    @app.post("/predict")
    async def predict(payload: dict):
        x = torch.tensor(payload["x"], dtype=torch.float32).unsqueeze(0)
        with torch.inference_mode():
            y = model(x)
        return {"y": y[0].tolist()}

    return app


SCOPE = {
    "type": "http", "method": "POST", "path": "/predict", "headers": [(b"content-type", b"application/json")],
    "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "",
}  # fmt: skip


async def per_request_us(app) -> float:
    message = {"type": "http.request", "body": BODY, "more_body": False}

    async def receive():
        return message

    async def send(_):
        pass

    t = time.perf_counter()
    for _ in range(N):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - t) / N * 1e6


def bare_forward_us() -> float:
    model = build()
    t = time.perf_counter()
    for _ in range(N):
        x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float32).unsqueeze(0)
        with torch.inference_mode():
            model(x)[0].tolist()
    return (time.perf_counter() - t) / N * 1e6


async def main() -> None:
    ours = servescope.serve(Tiny(), max_batch_size=8)  # the default: model code on the worker thread
    inline = servescope.serve(Tiny(), max_batch_size=8, inline_below_ms=5)  # opted in: a lone request on the loop
    for app in (ours, inline):
        await app.startup()
        assert await app.wait_ready() == "ready"
    theirs = fastapi_app()
    apps = {"servescope.serve": ours, "servescope.serve inline": inline, "FastAPI async def (naive)": theirs}
    runs: dict[str, list[float]] = {name: [] for name in apps}
    runs["bare forward (floor)"] = []
    for app in apps.values():  # warm them all
        await per_request_us(app)
    for _ in range(REPEATS):
        for name, app in apps.items():
            runs[name].append(await per_request_us(app))
        runs["bare forward (floor)"].append(bare_forward_us())
    for app in (ours, inline):
        await app.shutdown()
    med = {k: statistics.median(v) for k, v in runs.items()}
    floor = med["bare forward (floor)"]
    fa_over = med["FastAPI async def (naive)"] - floor
    print(f"in-process ASGI, c=1, {N} requests x {REPEATS} interleaved repeats (median), torch threads 1")
    print(f"{'':28} {'us/request':>11} {'overhead us':>12} {'overhead vs FastAPI':>20}")
    for name, us in med.items():
        over = us - floor
        print(f"{name:28} {us:>11.1f} {over:>12.1f} {over / fa_over:>19.2f}x")


if __name__ == "__main__":
    uvloop.run(main())
