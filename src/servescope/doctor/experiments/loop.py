"""The handler moved off the event loop: what a plain ``def`` endpoint (run on a worker
thread) would do, tried on the endpoint as written, under concurrent callers."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any, Callable

from ..evidence import Evidence, WhatIf
from .lab import Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["off_the_loop"]


def off_the_loop(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    conc = ev.concurrent
    if conc is None or conc.concurrency < 2:
        return None
    on_loop = conc.forwards is not None and conc.forwards.on_event_loop * 2 >= max(conc.requests, 1)
    busy = conc.loop is not None and conc.loop.busy_share >= 0.3 and conc.loop.longest_busy_ms >= 20.0
    if not (on_loop or busy):
        return None
    endpoint = lab.endpoint
    streamed = ev.warm is not None and ev.warm.first_chunk_p50_ms is not None
    count = [0]
    apply, how = _applier(endpoint, streamed, count)
    if apply is None:
        return WhatIf(fix="the handler on a worker thread", concurrency=conc.concurrency, why_not=how)
    note = (
        "the work on the loop is not in an `async def` endpoint or generator it can move (a `def` endpoint's response "
        "is encoded on the loop by the framework; routes under a Mount or in middleware are not reached)"
    )
    # (by throughput: the loop takes its waiting requests in no set order, and a short block's
    # median as written ran 20 ms under its steady state beside a neighbour, where its callers
    # over its throughput gave the saving the `def` twin realized: 16.0-16.2 ms against 16.6)
    fix = Fix("off-the-loop", how, apply, hits=lambda: count[0], no_effect=note, by_throughput=True)
    return lab.compare(fix, concurrency=conc.concurrency)


def _applier(endpoint: Any, streamed: bool, count: list[int]) -> tuple[Callable[[], Callable[[], None]] | None, str]:
    if getattr(endpoint, "kind", "") == "function":
        if not getattr(endpoint, "is_async", False):
            return None, "the handler is not `async def`"

        def on_threads() -> Callable[[], None]:
            endpoint.off_loop = True
            count[0] += 1
            return lambda: setattr(endpoint, "off_loop", False)

        return on_threads, "the `async def` handler run on a worker thread, each call with an event loop of its own"
    app = getattr(endpoint, "user_app", None)
    if app is None or getattr(endpoint, "kind", "") != "asgi":
        return None, "the app has no event loop of its own to move work off (WSGI)"
    if streamed:
        return _stream_steps(count), "each step of the streamed answer's `async` generator run on a worker thread (its own event loop)"
    routing = sys.modules.get("fastapi.routing")
    if routing is not None and type(app).__module__.startswith("fastapi"):
        return _fastapi(routing, count), "the `async def` endpoint run on Starlette's thread pool (as a plain `def` endpoint is)"
    return _starlette(app, count), "the `async def` endpoint run on a worker thread (the body read first, on the loop)"


def _fastapi(routing: Any, count: list[int]) -> Callable[[], Callable[[], None]]:
    from starlette.concurrency import run_in_threadpool

    original = routing.run_endpoint_function

    async def off_loop(*, dependant: Any, values: dict[str, Any], is_coroutine: bool) -> Any:
        if is_coroutine:
            count[0] += 1
            return await run_in_threadpool(lambda: asyncio.run(dependant.call(**values)))
        return await original(dependant=dependant, values=values, is_coroutine=is_coroutine)

    def apply() -> Callable[[], None]:
        with patching() as patches:
            patches.set(routing, "run_endpoint_function", off_loop)
        return patches.undo

    return apply


class _StepThread:
    """An event loop on a thread of its own, for one stream's steps."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="servescope-stream-step")
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(1)
        if not self.loop.is_running():
            self.loop.close()


def _off_loop(content: Any) -> Any:
    """The async generator driven step by step on a thread of its own: the server's loop
    only waits for each step, as a plain generator's steps run on Starlette's thread pool."""
    it = content.__aiter__()

    async def step() -> tuple[bool, Any]:
        try:
            return True, await it.__anext__()
        except StopAsyncIteration:
            return False, None

    async def stepped() -> Any:
        worker = _StepThread()
        try:
            while True:
                more, item = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(step(), worker.loop))
                if not more:
                    return
                yield item
        finally:
            close = getattr(it, "aclose", None)
            if close is not None:
                try:
                    asyncio.run_coroutine_threadsafe(close(), worker.loop).result(5)
                except Exception:  # a generator that fails to close: the request is over anyway
                    pass
            worker.stop()

    return stepped()


def _stream_steps(count: list[int]) -> Callable[[], Callable[[], None]]:
    from starlette.responses import StreamingResponse

    original = StreamingResponse.__init__

    def init(self: Any, content: Any, *args: Any, **kwargs: Any) -> None:
        if hasattr(content, "__aiter__"):
            count[0] += 1
            content = _off_loop(content)
        original(self, content, *args, **kwargs)

    def apply() -> Callable[[], None]:
        with patching() as patches:
            patches.set(StreamingResponse, "__init__", init)
        return patches.undo

    return apply


def _starlette(app: Any, count: list[int]) -> Callable[[], Callable[[], None]]:
    from starlette.concurrency import run_in_threadpool
    from starlette.routing import Route, request_response

    def offloaded(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any) -> Any:
            count[0] += 1
            await request.body()  # read on the server's loop: the handler's own reads find it there
            return await run_in_threadpool(lambda: asyncio.run(endpoint(request)))

        return run

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for route in getattr(app, "routes", []) or []:
                if isinstance(route, Route) and asyncio.iscoroutinefunction(route.endpoint):
                    patches.set(route, "app", request_response(offloaded(route.endpoint)))
        return patches.undo

    return apply
