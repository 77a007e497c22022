"""The runtime's HTTP plumbing: answering, deadlines on futures and reads, a client that
leaves, and the Prometheus metrics (serve/app.py is the runtime; this is what it sends with)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import orjson

from ..recorder import Recorder
from ..report import Report
from .batching import Item

__all__ = ["Metrics", "disconnected", "error_body", "expire", "push", "read_too_slow", "resolve", "respond"]

JSON = [(b"content-type", b"application/json")]


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def read_too_slow(task: asyncio.Task[Any], expired: list[bool]) -> None:
    expired.append(True)  # (so the reader can tell this cancel of ours from the server's)
    task.cancel()


def expire(future: asyncio.Future[Item]) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


def resolve(pairs: list[tuple[asyncio.Future[Item], Item]]) -> None:
    for future, item in pairs:
        if not future.done():
            future.set_result(item)


def push(batch: list[tuple[Item, list[bytes], bool]]) -> None:
    """On the event loop: streamed chunks from the worker into each item's channel (made, and
    the item's future resolved, at its first chunk); ``None`` in the channel ends the stream."""
    for item, chunks, ended in batch:
        channel = item.channel
        if channel is None:
            channel = item.channel = asyncio.Queue()
            if item.future is not None and not item.future.done():
                item.future.set_result(item)
        for chunk in chunks:
            channel.put_nowait(chunk)
        if ended:
            channel.put_nowait(None)


async def disconnected(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = headers if headers is not None else JSON
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Metrics:
    """The runtime's Prometheus metrics: stages and statuses from the recorder at scrape time
    (nothing per request), batch sizes per batch, queue depth at scrape."""

    def __init__(self, recorder: Recorder | Callable[[], Report]) -> None:
        import prometheus_client as prom

        from ..exporters import RecorderCollector

        self._prom = prom
        self.registry = prom.CollectorRegistry()
        self.registry.register(RecorderCollector(recorder))
        self.batch_size = prom.Histogram(
            "servescope_batch_size", "Items per forward", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry
        )
        self.queue_depth = prom.Gauge("servescope_queue_depth", "Items waiting for the worker", registry=self.registry)
        self.threads = prom.Gauge(
            "servescope_torch_threads", "torch intra-op threads, and where the number came from", ["source"], registry=self.registry
        )
        self.omp_wait = prom.Gauge(
            "servescope_openmp_wait_policy", "How OpenMP's idle threads wait (1 for the policy in force), and who chose it", ["policy", "source"], registry=self.registry
        )
        self.lanes = prom.Gauge(
            "servescope_forward_lanes", "Forwards run at once when a batch has several, and why that many", ["why"], registry=self.registry
        )
        self.replacements = prom.Counter(
            "servescope_worker_replacements", "Workers replaced after a batch outlived batch_timeout_s", registry=self.registry
        )
        # resident memory, CPU time and open files of this process (Linux): growth per request
        # is process_resident_memory_bytes over servescope_requests_total
        prom.ProcessCollector(registry=self.registry)

    @classmethod
    def create(cls, recorder: Recorder | Callable[[], Report]) -> Metrics | None:
        try:
            return cls(recorder)
        except ImportError:
            return None

    def exposition(self) -> tuple[bytes, str]:
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST
