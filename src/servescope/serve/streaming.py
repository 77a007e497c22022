"""Streamed answers on the worker: a model whose ``infer`` yields (a step at a time, for the
whole batch) or whose ``postprocess`` yields (a chunk at a time, per item). Each chunk is
serialized as it is made and handed to the server; streams advance a round at a time between
batches, and one whose reader is behind waits for it. The ``Streaming`` methods are
``Runtime``'s (runtime.py), which owns the model, its hooks and the forward.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple

from .batching import Item
from .collate import to_host
from .model import Model

__all__ = ["MAX_UNSENT_BYTES", "Streaming"]

log = logging.getLogger("servescope")


class Streaming:
    """The methods of ``Runtime`` that run streamed answers."""

    model: Model
    live: list[tuple[Iterator[bool], list[Item]]] | None
    on_batch_done: Callable[[list[Item]], None] | None
    on_stream: Callable[[list[Item]], None] | None
    on_progress: Callable[[], None] | None
    _postprocess: Callable[[Item, Any], Any]
    _serialize: Callable[[Item, Any, str], bytes | None]
    _call: Callable[..., Any]
    tuner: Any  # (a ThreadTuner, or None: threads.py)

    def _run(self, stream: Iterator[bool], items: list[Item]) -> None:
        """Start a stream: its first round now; the rest here too (warm-up, no server), or one
        round per ``advance()`` beside the other live streams and new batches."""
        if self.live is None:  # (warm-up: nothing is sent, so no reader is ever behind)
            for _ in stream:
                pass
        elif next(stream, _END) is not _END:
            self.live.append((stream, items))

    def advance(self) -> bool | None:
        """One round of every live stream (a step of each model that yields, a chunk of each
        postprocess that yields). None when no stream is live any more; False when every live
        stream waits for its readers (nothing moved: the worker may wait a moment); True
        otherwise. The batcher calls it between batches, so a request that comes while others
        stream starts at once."""
        live = self.live or []
        moved = False
        for entry in list(live):
            stream, items = entry
            try:
                went = next(stream, _END)
                more = went is not _END
                moved = moved or went is not False
            except Exception as exc:  # a bug of ours, or a stream still running on a worker the watchdog replaced
                log.error("servescope: a stream failed and is dropped: %s: %s", type(exc).__name__, exc)
                _close(stream)
                more = False
                for it in items:
                    if it.error is None and not it.ended:
                        _fail(it, exc, 500, "forward")
                self._end_streams([it for it in items if not it.ended])
            if not more:
                live.remove(entry)
        return moved if live else None

    def _stream_steps(self, items: list[Item], steps: _Steps) -> Iterator[bool]:
        """A model whose ``infer`` yields: each step's output (for the whole batch: the items
        keep sharing forwards) is split, postprocessed per item into that item's next chunk
        (``None``: no chunk this step) and handed to the server, until the generator ends, or
        every item has failed or its client has left. Yields between steps."""
        gen, step = steps
        clock = time.perf_counter_ns
        for it in items:
            it.streaming = True
        try:
            while step is not _END:
                t = clock()
                parts = self.model.split(to_host(step), len(items))
                took = clock() - t
                over = []
                for it, part in zip(items, parts):
                    if it.error is None and not it.cancelled and not it.ended:
                        it.durations["to_host"] = it.durations.get("to_host", 0) + took
                        if self._chunk(it, part) is Model.END:
                            over.append(it)
                self._hand_over(items)
                over += [it for it in items if (it.error is not None or it.cancelled) and not it.ended]
                if over:  # done (Model.END), failed, or its client left: its answer ends now, not with the batch's
                    self._end_streams(over)
                if all(it.error is not None or it.cancelled or it.ended for it in items):
                    break  # (the generator is closed: no step for nobody)
                yield True  # other streams' steps, and new batches, between two of this one
                while (readers := [it for it in items if it.error is None and not it.cancelled and not it.ended]) and all(
                    _behind(it) for it in readers
                ):
                    yield False  # every reader of this batch is behind: its next step waits for them
                if not readers:
                    break  # every item ended, failed or left while it waited
                if self.on_progress is not None:
                    self.on_progress()
                tuner = self.tuner  # (each step is a forward: its thread count is measured too)
                threads = tuner.next() if tuner is not None else 0
                t = clock()
                step = self._call(next, gen, _END)
                took = clock() - t
                if tuner is not None and step is not _END:
                    tuner.record(threads, took, len(items))
                for it in items:
                    it.durations["infer"] = it.durations.get("infer", 0) + took
        except Exception as exc:  # chunks may be out already: the items fail, no retry
            for it in items:
                if it.error is None:
                    _fail(it, exc, 500, "forward")
        finally:
            _close(gen)
        self._end_streams(items)

    def _chunk(self, it: Item, output: Any) -> Any:
        """One step's output for one item: postprocessed, serialized as the item's next chunk;
        ``Model.END`` when postprocess says the item's answer is complete."""
        result = self._postprocess(it, output)
        if result is _FAILED or result is Model.END:
            return result
        if inspect.isgenerator(result):
            self._stream_result(it, result)
        elif result is not None:
            self._add_chunk(it, result)

    def _stream_result(self, it: Item, chunks: Any) -> None:
        """A postprocess that yields, within a step: each chunk handed over as it is made (the
        step's own wait for readers that are behind applies before the next step)."""
        for _ in self._interleave([(it, chunks)], end=False, bounded=False):
            pass

    def _interleave(self, streams: list[tuple[Item, Any]], *, end: bool = True, bounded: bool = True) -> Iterator[bool]:
        """The items' postprocess generators, a chunk of each in turn (a batch's answers all
        start streaming, not one after the other), each chunk handed over as it is made;
        yields after each round."""
        clock = time.perf_counter_ns
        live = list(streams)
        for it, _ in streams:
            it.streaming = True
        while live:
            moved = False
            for pair in list(live):
                it, chunks = pair
                done = it.cancelled or it.error is not None
                if not done and bounded and _behind(it):
                    continue  # its reader is behind: its next chunk waits (the others go on)
                moved = True
                if not done:
                    t = clock()
                    chunk = None
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        done = True
                    except Exception as exc:
                        _fail(it, exc, 500, "postprocess")
                        done = True
                    it.durations["postprocess"] = it.durations.get("postprocess", 0) + clock() - t
                    if chunk is not None:
                        self._add_chunk(it, chunk)
                        self._hand_over([it])
                if done:
                    _close(chunks)
                    live.remove(pair)
                    if end:  # its answer ends now, not with the batch's longest
                        self._end_streams([it])
            if live:
                yield moved

    def _add_chunk(self, it: Item, result: Any) -> None:
        data = self._serialize(it, result, "json")  # (a stream is JSON lines or SSE, whatever was accepted)
        if data is None:
            return
        chunk = b"data: " + data + b"\n\n" if it.accept == "sse" else data + b"\n"
        it.handed += len(chunk)
        if it.chunks is None:  # the first: what the head's Server-Timing says
            it.chunks = []
            it.head_timing = dict(it.durations)
            it.first_ns = time.perf_counter_ns()
        it.chunks.append(chunk)

    def _end_streams(self, items: list[Item]) -> None:
        """The streams of these items are over (a stream that made no chunk is an empty one,
        unless the item failed before it began: then it is an error answer as any other, given
        to ``on_batch_done``)."""
        ended, failed = [], []
        for it in items:
            if it.ended:
                continue
            if it.chunks is None and it.error is not None:
                it.ended = True
                failed.append(it)
                continue
            if it.chunks is None:
                it.chunks, it.head_timing, it.first_ns = [], dict(it.durations), 0
            it.ended = True
            ended.append(it)
        self._hand_over(ended)
        if failed and self.on_batch_done is not None:
            self.on_batch_done(failed)

    def _hand_over(self, items: list[Item]) -> None:
        ready = [it for it in items if it.chunks or (it.ended and it.chunks is not None)]
        if not ready:
            return
        if self.on_stream is not None:
            self.on_stream(ready)
        else:  # warm-up, tests: nobody to send to
            for it in ready:
                it.chunks = []
                it.sent = it.handed


# these, _Steps and _fail are the batch path's too (runtime.py)
#: The end of a model's generator.
_END = object()
#: A hook raised: the item has failed.
_FAILED = object()


class _Steps(NamedTuple):
    """A forward whose ``infer`` yields: the generator, and its first step's output."""

    gen: Any
    first: Any


#: A streamed answer whose reader is this many bytes behind (made, not yet sent) waits: its
#: next chunk is not made until the reader catches up (a batch's step waits when all its
#: readers are behind).
MAX_UNSENT_BYTES = 1 << 20


def _behind(it: Item) -> bool:
    return it.handed - it.sent > MAX_UNSENT_BYTES and not it.cancelled


def _close(gen: Any) -> None:
    """Close the model's generator (its ``finally`` runs now); what it raises there is logged."""
    try:
        gen.close()
    except Exception as exc:
        log.warning("servescope: closing the model's generator raised %s: %s", type(exc).__name__, exc)


def _fail(item: Item, exc: BaseException, status: int, stage: str = "model") -> None:
    """Mark ``item`` failed. ``error`` is the full text, for warm-up and the server's log; what
    the client is told is decided by the server (in general terms, unless debugging)."""
    item.error = f"{type(exc).__name__}: {exc}"
    item.status = status
    item.exc = exc
    item.stage = stage
