"""Serving overhead at concurrency 1, without the network: servescope.serve against a naive
FastAPI endpoint, the same tiny model (Linear 4->2, ~10 us), called as ASGI apps in-process.

    python bench/serve_overhead.py

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
    ours = servescope.serve(Tiny(), max_batch_size=8)
    await ours.startup()
    assert await ours.wait_ready() == "ready"
    theirs = fastapi_app()
    runs: dict[str, list[float]] = {"servescope.serve": [], "FastAPI async def (naive)": [], "bare forward (floor)": []}
    for app in (ours, theirs):  # warm both
        await per_request_us(app)
    for _ in range(REPEATS):
        runs["servescope.serve"].append(await per_request_us(ours))
        runs["FastAPI async def (naive)"].append(await per_request_us(theirs))
        runs["bare forward (floor)"].append(bare_forward_us())
    await ours.shutdown()
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
