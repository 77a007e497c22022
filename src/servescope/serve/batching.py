"""Dynamic batching: one worker thread takes what is queued, runs it as one forward.

A lone request never waits for a batch that will not fill: the worker takes the first item
as soon as it arrives and only what is *already* queued beside it (up to ``max_batch_size``),
so batches grow exactly when the model is busy. ``max_wait_ms > 0`` adds an optional wait
for more items after the first, for models where a bigger batch is worth the delay.

The queue is bounded: ``submit`` answers False when ``max_queue`` items wait, and the
server answers 503 at once instead of letting latency grow without bound.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

__all__ = ["Batcher", "Item"]

_STOP = object()
_WAKE = object()  # no item: the worker looks at the streams under way (wake())
#: How long the worker waits for a batch when every stream under way waits on its readers.
STALLED_WAIT_S = 0.002
log = logging.getLogger("servescope")


class Item:
    """One request's passage through the worker."""

    __slots__ = (
        "payload", "enqueued_ns", "cancelled", "durations", "body", "error", "status", "future", "accept", "exc", "stage",
        "unvalidated", "chunks", "ended", "head_timing", "first_ns", "channel", "streaming", "handed", "sent",
    )  # fmt: skip

    def __init__(self, payload: Any, *, future: Any = None, accept: str = "json", unvalidated: bool = False) -> None:
        self.payload = payload
        self.unvalidated = unvalidated  # the worker runs Model.validate first (off the event loop)
        self.enqueued_ns = 0
        self.cancelled = False  # the client left, or its deadline passed: skip it
        self.durations: dict[str, int] = {}
        self.body: bytes | None = None
        self.error: str | None = None
        self.status = 200
        self.future = future  # an asyncio.Future the server awaits (None in warm-up and tests)
        self.accept = accept
        self.exc: BaseException | None = None  # what failed it, for the server's log (never the client)
        self.stage = ""  # the model's step that failed: validate, preprocess, forward, postprocess, serialize
        # a streamed answer (the model yields): chunks serialized on the worker, not yet handed
        # over; whether the last was; the stages before the first chunk, and when it was made
        self.chunks: list[bytes] | None = None
        self.ended = False
        self.head_timing: dict[str, int] | None = None
        self.first_ns = 0
        self.channel: Any = None  # the server's queue of chunks to send (on the event loop)
        self.streaming = False  # its answer is a stream (answered chunk by chunk, not at the batch's end)
        self.handed = 0  # bytes of its stream made (the worker counts)
        self.sent = 0  # and sent (the server counts): the difference waits in memory


class Batcher:
    """Feeds batches of items to ``process(items)`` on its own thread."""

    def __init__(
        self,
        process: Callable[[list[Item]], None],
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 0.0,
        max_queue: int = 256,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.process = process
        self.max_batch_size = max_batch_size
        self.max_wait_ns = round(max_wait_ms * 1e6)
        self.max_queue = max_queue
        self.clock = clock
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.batches = 0
        self.busy = False  # a batch is being processed right now
        self.model_lock = threading.Lock()  # one forward at a time: the worker's, or an inline one
        #: when the batch being processed started (``clock``), None when idle: the watchdog's view
        self.batch_started_ns: int | None = None
        self._generation = 0  # a replaced worker sees it change and leaves once it wakes
        self.replacements = 0
        #: streams under way (models that yield): one round of each, between batches; returns
        #: None when none is under way, False when all wait on their readers, True otherwise
        self.advance: Callable[[], bool | None] | None = None

    def idle(self) -> bool:
        """No batch running and nothing queued."""
        return not self.busy and not self._q.qsize()

    def depth(self) -> int:
        return self._q.qsize()

    def submit(self, item: Item) -> bool:
        """Queue an item; False (and nothing queued) when the queue is full."""
        if self._q.qsize() >= self.max_queue:
            return False
        item.enqueued_ns = self.clock()
        self._q.put(item)
        return True

    def next_batch(self, *, block: bool = True, timeout: float | None = None) -> list[Item] | None:
        """The next batch, or None once stopped. ``block=False`` returns [] when idle, as does
        a wait that passes ``timeout`` seconds."""
        q = self._q
        while True:
            try:
                first = q.get(block, timeout)
            except queue.Empty:
                return []
            if first is _STOP:
                return None
            if first is _WAKE:
                return []
            if not first.cancelled:
                break
        batch = [first]
        deadline = self.clock() + self.max_wait_ns if self.max_wait_ns else 0
        while len(batch) < self.max_batch_size:
            try:
                item = q.get_nowait()
            except queue.Empty:
                remaining = deadline - self.clock() if deadline else 0
                if remaining <= 0:
                    break
                try:
                    item = q.get(timeout=remaining / 1e9)
                except queue.Empty:
                    break
            if item is _STOP:
                q.put(_STOP)  # finish this batch, stop on the next call
                break
            if item is not _WAKE and not item.cancelled:
                batch.append(item)
        return batch

    def run(self, generation: int = 0) -> None:
        """The worker loop: until ``stop()`` (the streams under way finished first), or until it
        is replaced (then it leaves as soon as the call it was stuck in returns, and its late
        results go nowhere). Between batches, one round of the streams under way (``advance``)."""
        live = self.advance is not None  # a worker that replaced another: streams may be under way
        stalled = False
        while generation == self._generation:
            # streams under way: look for a batch and go on; all waiting on their readers: wait a moment
            batch = self.next_batch(block=not live or stalled, timeout=STALLED_WAIT_S if stalled else None)
            if batch is None:
                while live and generation == self._generation:  # stopping: the streams end first
                    with self.model_lock:
                        state = self._advance()
                    live = state is not None
                    if state is False:
                        time.sleep(STALLED_WAIT_S)
                return
            lock = self.model_lock
            with lock:
                if generation != self._generation:  # replaced while waiting: the batch is the new worker's
                    for item in batch:
                        self._q.put(item)
                    return
                self.batches += 1 if batch else 0
                self.busy = True
                self.batch_started_ns = self.clock()
                try:
                    if batch:
                        self.process(batch)
                    state = self._advance()
                    live, stalled = state is not None, state is False
                finally:
                    if generation == self._generation:
                        self.busy = False
                        self.batch_started_ns = None

    def wake(self) -> None:
        """A stream was started off the worker (a request run inline): the worker, perhaps
        waiting for a batch, takes it on."""
        self._q.put(_WAKE)

    def _advance(self) -> bool | None:
        if self.advance is None:
            return None
        try:
            return self.advance()
        except Exception:  # a bug of ours: said, and the worker goes on (its death would hang every request)
            log.exception("servescope: advancing the streams under way failed")
            return None

    def progress(self) -> None:
        """The running batch moved on (a model that yields made a step): the watchdog's
        ``batch_timeout_s`` counts from now, so a long stream is not taken for a stuck one.
        Only the current worker's progress counts (not a replaced one's that woke up)."""
        if self.busy and threading.current_thread() is self._thread:
            self.batch_started_ns = self.clock()

    def replace_worker(self) -> None:
        """Start a fresh worker beside one stuck in a batch. The stuck thread cannot be stopped
        (Python cannot interrupt a call): it is abandoned, and leaves if its call ever returns.
        The new worker takes the queue and a lock of its own."""
        self._generation += 1
        self.replacements += 1
        self.model_lock = threading.Lock()
        self.busy = False
        self.batch_started_ns = None
        self.start()

    def run_inline(self, item: Item) -> bool:
        """Process a lone item on the calling thread, when the worker is idle and nothing is
        queued; False (nothing done) otherwise. Saves the two thread hand-offs of a lone
        request; the caller decides when a short block of its own thread is harmless."""
        if not self.idle() or not self.model_lock.acquire(blocking=False):
            return False
        lock = self.model_lock
        try:
            self.batches += 1
            self.busy = True
            item.enqueued_ns = self.batch_started_ns = self.clock()
            self.process([item])
        finally:
            self.busy = False
            self.batch_started_ns = None
            lock.release()
        return True

    def start(self, name: str = "servescope-worker") -> None:
        self._thread = threading.Thread(target=self.run, args=(self._generation,), name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish what is queued, then end the worker thread."""
        self._q.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)
