"""What the worker does with a batch: preprocess, collate, copy, forward, split, postprocess,
serialize, each timed; one item's failure stays that item's.

torch is imported only when the user's model is a torch model or returns tensors.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable, NamedTuple

import orjson

from ..environment import available_cpus
from ..timing import OTHER, Trace, resolve_clock, stage
from .batching import Item
from .model import Model
from .threads import ThreadTuner, thread_choice, thread_choices

__all__ = ["Runtime", "collate", "split"]

log = logging.getLogger("servescope")
#: A forward whose padding would pass this share of it is split (length-aware batching).
MAX_PADDING_SHARE = 0.25
_WALL = resolve_clock("wall", None)  # the per-item hooks run on the host: no device clock, no sync

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _default(obj: Any) -> Any:
    if _is_tensor(obj):
        return obj.detach().cpu().numpy()  # orjson writes numpy arrays natively: no tolist()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}: return JSON-friendly values from postprocess")


def _msgpack_default(obj: Any) -> Any:
    value = _default(obj)
    return value.tolist() if hasattr(value, "tolist") else value


def serialize(result: Any, accept: str) -> bytes:
    if accept == "msgpack":
        import msgpack

        return msgpack.packb(result, default=_msgpack_default)
    return orjson.dumps(result, default=_default, option=_JSON_OPTS)


class Runtime:
    """Loads the model once, warms it up, and processes batches for the Batcher."""

    def __init__(self, model: Model, *, device: str | None = None, threads: int | None = None, max_batch_tokens: int | None = None) -> None:
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.requested_device = device
        self.requested_threads = threads
        self.device = "cpu"
        self.clock: Any = None
        self._pinned: dict[tuple[Any, ...], Any] = {}
        self._said_unbatched = False
        #: postprocess(output, request): the hook takes the validated request too
        self._post_with_request = _takes_two(model.postprocess)
        self.info: dict[str, Any] = {}
        #: called on the worker thread with each forward's answered items, then the batch's
        #: other items (the server resolves their futures)
        self.on_batch_done: Callable[[list[Item]], None] | None = None
        #: called with the number of items of each forward (the server's batch-size histogram)
        self.on_forward: Callable[[int], None] | None = None
        #: called on the worker thread with the items of a streamed answer that have new chunks
        #: (``Item.chunks``) or have ended (``Item.ended``): the server takes the chunks and sends them
        self.on_stream: Callable[[list[Item]], None] | None = None
        #: called between the steps of a model that yields (the watchdog sees the batch move on)
        self.on_progress: Callable[[], None] | None = None
        #: streams under way and their items, advanced a round at a time by ``advance()`` (None:
        #: each stream runs to its end in the call that starts it, as in warm-up)
        self.live: list[tuple[Iterator[bool], list[Item]]] | None = None
        #: adapts torch's threads while serving (``adapt_threads``), when the user did not fix them
        self.tuner: ThreadTuner | None = None

    # -- start-up ----------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """Pick the device and threads, load once, eval(), and say what was picked."""
        torch = _torch()
        try:
            import torch  # noqa: F811 - the runtime is for torch models first
        except ImportError:
            torch = None
        device = self.requested_device
        if device is None:
            device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
        self.device = device
        cpus = available_cpus()
        if torch is not None:
            threads, source = thread_choice(self.requested_threads, cpus)
            torch.set_num_threads(threads)
            self.info.update(torch_threads=threads, threads_from=source)
        t0 = time.perf_counter()
        loaded = self.model.load(device)
        if loaded is None:
            raise TypeError(f"{type(self.model).__name__}.load() returned None: return the model")
        if torch is not None and isinstance(loaded, torch.nn.Module):
            loaded = loaded.to(device).eval()
        self.model.model = loaded
        self.model.device = device
        self.info.update(device=device, cpus_available=cpus, load_s=round(time.perf_counter() - t0, 3))
        # CUDA is initialised now if it is used: events time the device stages right
        self.clock = resolve_clock("auto", None)
        return self.info

    def adapt_threads(self, on_switch: Callable[[int, int, str], None] | None = None) -> bool:
        """From now on (after warm-up) adapt torch's CPU threads to what forwards take
        (``serve/threads.py``) for a torch model on the CPU, unless ``--threads`` or
        ``OMP_NUM_THREADS`` fixed them; True when adapting."""
        torch = sys.modules.get("torch")
        n = self.info.get("torch_threads")
        if torch is None or self.device != "cpu" or self.info.get("threads_from") != "the CPUs available" or not n or n < 2:
            return False
        if not isinstance(self.model.model, torch.nn.Module):  # (ONNX Runtime, scikit-learn: torch's threads are not theirs)
            return False
        self.tuner = ThreadTuner(apply=torch.set_num_threads, start=n, choices=thread_choices(n), on_switch=on_switch)
        return True

    def warm_up(self, example: Any, batch_sizes: list[int]) -> list[int]:
        """Run the example (and ``Model.examples``) through every stage at each batch size,
        mixed within each batch as requests of different lengths are; raises if it fails."""
        values = [self.model.validate(e) for e in [example, *(self.model.examples or [])]]
        for n in batch_sizes:
            batches = [[v] for v in values] if n == 1 else [[values[i % len(values)] for i in range(n)]]
            for batch in batches:
                items = [Item(v) for v in batch]
                self.process(items)
                failed = [i for i in items if i.error]
                if failed:
                    raise RuntimeError(f"warm-up at batch size {n} failed: {failed[0].error}")
        return batch_sizes

    # -- the batch ---------------------------------------------------------------------------
    def process(self, items: list[Item]) -> None:
        """Run a batch; each forward's items are answered as soon as their forward and
        postprocess are done (``on_batch_done`` once per forward, then once for the rest)."""
        delivered: set[int] = set()
        try:
            self._process(items, delivered)
        except Exception as exc:  # a bug of ours or a hook's: fail the batch, keep the worker
            for it in items:
                if it.body is None and it.error is None and not it.streaming:
                    _fail(it, exc, 500)
        rest = [it for it in items if id(it) not in delivered and not it.streaming]  # (a stream answers itself)
        if rest and self.on_batch_done is not None:
            self.on_batch_done(rest)

    def _process(self, items: list[Item], delivered: set[int]) -> None:
        start = time.perf_counter_ns()
        model = self.model
        inputs = []
        live = []
        for it in items:
            if it.enqueued_ns:
                it.durations["queue"] = start - it.enqueued_ns
            if it.unvalidated:
                try:
                    it.payload = _hook(it, "validate", model.validate, it.payload)
                except Exception as exc:
                    _fail(it, exc, 422, "validate")
                    continue
            try:
                inputs.append(_hook(it, "preprocess", model.preprocess, it.payload))
                live.append(it)
            except KeyError as exc:  # a field the request lacks is the request's fault: 422
                missing = exc.args[0] if exc.args else None
                bad_request = isinstance(it.payload, dict) and isinstance(missing, str) and missing not in it.payload
                _fail(it, exc, 422 if bad_request else 500, "preprocess")
            except Exception as exc:
                _fail(it, exc, 500, "preprocess")
        ready = time.perf_counter_ns()
        for group in self._groups(inputs):  # similar lengths share a forward
            members = [live[i] for i in group]
            waited = time.perf_counter_ns() - ready  # for the batch's earlier forwards: queueing too
            for it in members:
                it.durations["queue"] = it.durations.get("queue", 0) + waited
            if self.on_forward is not None:
                self.on_forward(len(members))
            streams = []
            for it, out in zip(members, self._forward(members, [inputs[i] for i in group])):
                if it.error is None and out is not _STREAMED:
                    chunks = self._answer(it, out)
                    if chunks is not None:
                        streams.append((it, chunks))
            if streams:
                self._run(self._interleave(streams), [it for it, _ in streams])
            if self.on_batch_done is not None:  # answered now, not after the batch's other forwards
                delivered.update(id(it) for it in members)
                answered = [it for it in members if not it.streaming]  # (streams answer as they go)
                if answered:
                    self.on_batch_done(answered)

    def _answer(self, it: Item, out: Any) -> Any:
        """Postprocess and serialize one item's output into its body (or its error); a
        postprocess that yields is returned, to be streamed."""
        result = self._postprocess(it, out)
        if result is _FAILED:
            return None
        if inspect.isgenerator(result):  # postprocess yields: the answer streams
            return result
        it.body = self._serialize(it, result, it.accept)
        return None

    def _postprocess(self, it: Item, out: Any) -> Any:
        """The model's postprocess of one item's output (``_FAILED``: it raised, the item failed)."""
        try:
            if self._post_with_request:
                return _hook(it, "postprocess", self.model.postprocess, out, it.payload)
            return _hook(it, "postprocess", self.model.postprocess, out)
        except Exception as exc:
            _fail(it, exc, 500, "postprocess")
            return _FAILED

    def _serialize(self, it: Item, result: Any, accept: str) -> bytes | None:
        """``result`` as JSON (msgpack) bytes, timed; None when it cannot be (the item failed)."""
        t = time.perf_counter_ns()
        try:
            body = serialize(result, accept)
            if accept != "msgpack" and b"null" in body and _nonfinite(result):
                raise NonFiniteOutput("the model's output holds NaN or infinity, which JSON cannot carry")
            return body
        except Exception as exc:
            _fail(it, exc, 500, "serialize")
            return None
        finally:
            it.durations["serialize"] = it.durations.get("serialize", 0) + time.perf_counter_ns() - t

    # -- streamed answers --------------------------------------------------------------------
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
                t = clock()
                step = self._call(next, gen, _END)
                took = clock() - t
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

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under ``torch.inference_mode()`` where torch is in use."""
        torch = _torch()
        if torch is None:
            return fn(*args)
        with torch.inference_mode():
            return fn(*args)

    def _groups(self, inputs: list[Any]) -> list[list[int]]:
        """The batch's items (their indexes) in forwards of similar length: sorted by length,
        a forward ends where adding the next item would make padding more than
        ``MAX_PADDING_SHARE`` of it, or its tokens (items x the longest) pass
        ``max_batch_tokens``. Inputs without a length (or of one length) stay one forward."""
        n = len(inputs)
        if n < 2:
            return [list(range(n))] if n else []
        lengths = [self.model.length(x) for x in inputs]
        if any(length is None for length in lengths) or len(set(lengths)) == 1 and not self.max_batch_tokens:
            return [list(range(n))]
        order = sorted(range(n), key=lambda i: lengths[i])  # type: ignore[arg-type, return-value]
        groups: list[list[int]] = [[order[0]]]
        useful = lengths[order[0]]
        for i in order[1:]:
            longest, size = lengths[i], len(groups[-1]) + 1  # sorted: the newcomer is the longest
            padded = size * longest  # type: ignore[operator]
            over_budget = self.max_batch_tokens is not None and padded > self.max_batch_tokens
            if over_budget or padded - (useful + longest) > MAX_PADDING_SHARE * padded:  # type: ignore[operator]
                groups.append([i])
                useful = longest
            else:
                groups[-1].append(i)
                useful += longest  # type: ignore[operator]
        return groups

    def _forward(self, items: list[Item], inputs: list[Any]) -> list[Any]:
        """Collate, copy, forward, copy back and split; on failure retry one by one. A model
        that yields streams its items' answers here (their outputs are ``_STREAMED``)."""
        try:
            outs = self._batched(items, inputs)
        except Exception as exc:
            if len(items) == 1:
                _fail(items[0], exc, 500, "forward")
                return [None]
            batch_error = exc
        else:
            if isinstance(outs, _Steps):
                self._run(self._stream_steps(items, outs), items)
                return [_STREAMED] * len(items)
            return outs
        outs = []
        for it, x in zip(items, inputs):  # batch-mates of a bad item still get answers
            try:
                out = self._batched([it], [x])
            except Exception as exc:
                _fail(it, exc, 500, "forward")
                outs.append(None)
                continue
            if isinstance(out, _Steps):
                self._run(self._stream_steps([it], out), [it])
                outs.append(_STREAMED)
            else:
                outs.append(out[0])
        if all(it.error is None for it in items) and not self._said_unbatched:
            # every item runs alone, so the batch failed for being a batch: say so once, since
            # from here on each such batch silently costs len(items) forwards
            self._said_unbatched = True
            log.warning(
                "servescope: a batch of %d failed as a batch (%s: %s) and every item succeeded alone, so batches "
                "like it run item by item: override Model.collate() / Model.split(), or make preprocess "
                "return what stacks (docs/serve.md)", len(items), type(batch_error).__name__, batch_error,
            )  # fmt: skip
        return outs

    def _batched(self, items: list[Item], inputs: list[Any]) -> list[Any] | _Steps:
        # one trace for the batch, on the device's clock: the model's own servescope.stage()s
        # inside collate or infer count under their names; every item waited for all of it
        batch_trace = Trace(clock=self.clock)
        steps = None
        try:
            with batch_trace:
                with stage("to_device"):
                    batch = self._to_device(self.model.collate(inputs))
                with stage("infer"):
                    tuner = self.tuner
                    threads = tuner.next() if tuner is not None else 0
                    t0 = time.perf_counter_ns()
                    out = self._call(self.model.infer, batch)
                    if inspect.isgenerator(out):  # infer yields: its first step is this forward
                        steps = _Steps(out, self._call(next, out, _END))
                    if tuner is not None:
                        tuner.record(threads, time.perf_counter_ns() - t0, len(items))
                if steps is None:
                    with stage("to_host"):
                        out = to_host(out)
        finally:
            shared = {k: v for k, v in batch_trace.durations_ns.items() if k != OTHER}
            for it in items:
                it.durations.update(shared)
        return steps if steps is not None else self.model.split(out, len(items))

    def _to_device(self, batch: Any) -> Any:
        if self.device == "cpu":  # preprocess made it on the CPU: nothing to move
            return batch
        if not _is_tensor(batch):
            return to_device(batch, self.device)
        # CUDA: stage through a pinned buffer reused per shape, then a non-blocking copy
        key = (tuple(batch.shape), batch.dtype)
        buf = self._pinned.get(key)
        if buf is None:
            buf = self._pinned[key] = batch.new_empty(batch.shape).pin_memory()
        buf.copy_(batch)
        return buf.to(self.device, non_blocking=True)


#: The output of an item whose answer was streamed as its model yielded.
_STREAMED = object()
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


def _hook(item: Item, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call one of the model's per-item hooks inside a trace of its own: stages the hook opens
    itself (``servescope.stage("tokenize")``) count under their names, the rest under
    ``name``, all added to the item's stages (and so to Server-Timing, /metrics, /report)."""
    t = Trace(clock=_WALL)
    try:
        with t, stage(name):
            return fn(*args)
    finally:
        durations = item.durations
        for k, ns in t.durations_ns.items():
            if k != OTHER:
                durations[k] = durations.get(k, 0) + ns


def _takes_two(method: Any) -> bool:
    """Whether a bound method takes two positional arguments (``postprocess(output, request)``)."""
    import inspect

    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _fail(item: Item, exc: BaseException, status: int, stage: str = "model") -> None:
    """Mark ``item`` failed. ``error`` is the full text, for warm-up and the server's log; what
    the client is told is decided by the server (in general terms, unless debugging)."""
    item.error = f"{type(exc).__name__}: {exc}"
    item.status = status
    item.exc = exc
    item.stage = stage


def _nonfinite(value: Any, depth: int = 0) -> bool:
    """Whether a result holds NaN or infinity (which JSON cannot carry: orjson writes null)."""
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if depth > 16:
        return False
    if isinstance(value, dict):
        return any(_nonfinite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v, depth + 1) for v in value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind in ("f", "c"):  # numpy arrays and scalars
        import numpy as np

        return not bool(np.isfinite(value).all())
    if hasattr(value, "is_floating_point") and value.is_floating_point():  # a torch tensor
        return not bool(value.isfinite().all())
    return False


class NonFiniteOutput(ValueError):
    """The model's output held NaN or infinity: JSON cannot carry them (served as an error,
    never as a silent ``null``; msgpack carries them as they are)."""


def collate(inputs: list[Any], pad_values: Mapping[str, float] | None = None) -> Any:
    """Items into one batch, as models take them: tensors, numpy arrays and lists of numbers
    stacked along a new first dimension, right-padded to the longest item when lengths differ
    (with ``pad_values[field]``, 0 by default: attention masks and token type ids pad with 0);
    dicts and tuples field by field. A tokenizer's output (``BatchEncoding``, whose tensors
    already have a batch dimension of 1) is concatenated along that dimension instead."""
    first = inputs[0]
    pads = pad_values or {}
    if isinstance(first, Mapping):
        joined = type(first).__name__ == "BatchEncoding"
        return {k: _collate_field([x[k] for x in inputs], pads.get(k, 0), joined) for k in first}
    if isinstance(first, (tuple, list)) and first and not isinstance(first[0], (int, float)):
        if not _fields(inputs):  # a list of texts, images ... per item: the batch is the items' lists
            return list(inputs)
        return type(first)(collate(list(xs), pads) for xs in zip(*inputs))
    return _collate_field(inputs, pads.get("", 0), False)


def _fields(inputs: list[Any]) -> bool:
    """Whether the items' tuples (or lists) are fields to batch one by one, as ``(input_ids,
    attention_mask)`` are: the same number in every item, each a tensor, an array, a dict, a
    tuple or a list of numbers. A list of strings (sentences) or of images is an item's data."""
    n = len(inputs[0])
    np = sys.modules.get("numpy")
    torch = _torch()
    kinds = tuple(k for k in (Mapping, tuple, getattr(np, "ndarray", None), getattr(torch, "Tensor", None)) if k is not None)
    for x in inputs:
        if len(x) != n:
            return False
        for v in x:
            if not (isinstance(v, kinds) or (isinstance(v, list) and v and isinstance(v[0], (int, float)))):
                return False
    return True


def _collate_field(values: list[Any], pad: float, joined: bool) -> Any:
    torch = _torch()
    first = values[0]
    if isinstance(first, Mapping) or (isinstance(first, tuple) and first and not isinstance(first[0], (int, float))):
        return collate(values)
    if torch is None:
        return values
    np = sys.modules.get("numpy")
    if np is not None and isinstance(first, np.ndarray):
        values = [torch.from_numpy(v) for v in values]
        first = values[0]
    elif isinstance(first, list) and all(isinstance(v, list) for v in values):
        if len({len(v) for v in values}) > 1:  # ragged token ids: pad to the longest
            width = max(len(v) for v in values)
            values = [v + [pad] * (width - len(v)) for v in values]
        return torch.tensor(values)
    elif isinstance(first, (int, float)):
        return torch.tensor(values)
    if not isinstance(first, torch.Tensor):
        return values
    if joined and all(v.dim() >= 1 and v.shape[0] == 1 for v in values):
        return torch.cat(_padded(values, pad, torch), 0) if len(values) > 1 else first
    if len(values) == 1:
        return first.unsqueeze(0)
    return torch.stack(_padded(values, pad, torch))


def _padded(tensors: list[Any], pad: float, torch: Any) -> list[Any]:
    """The tensors right-padded to the largest size along every dimension (as they are when
    their shapes already agree)."""
    shape = tensors[0].shape
    if all(t.shape == shape for t in tensors):
        return tensors
    if len({t.dim() for t in tensors}) > 1:
        raise ValueError(f"cannot batch tensors of different ranks: {sorted({t.dim() for t in tensors})}")
    size = [max(sizes) for sizes in zip(*(t.shape for t in tensors))]
    out = []
    for t in tensors:
        if list(t.shape) == size:
            out.append(t)
            continue
        full = t.new_full(size, pad)
        full[tuple(slice(0, n) for n in t.shape)] = t
        out.append(full)
    return out


def to_device(batch: Any, device: str) -> Any:
    if _is_tensor(batch):
        return batch if str(batch.device) == device else batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_host(out: Any) -> Any:
    """One device-to-host copy per batch (not per item)."""
    if _is_tensor(out):
        return out.cpu() if out.device.type != "cpu" else out
    if isinstance(out, dict):
        return {k: to_host(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(to_host(v) for v in out)
    return out


def split(out: Any, n: int) -> list[Any]:
    """A batch's output split back into one output per item."""
    if isinstance(out, dict):
        parts = {k: split(v, n) for k, v in out.items()}
        return [{k: parts[k][i] for k in out} for i in range(n)]
    if isinstance(out, tuple):
        parts_t = [split(v, n) for v in out]
        return [tuple(p[i] for p in parts_t) for i in range(n)]
    if _is_tensor(out) and out.dim():
        if out.shape[0] != n:
            raise ValueError(f"the model returned {out.shape[0]} outputs for a batch of {n}")
        return list(out.unbind(0))  # one C call for the whole split
    if hasattr(out, "__getitem__") and hasattr(out, "__len__"):
        if len(out) != n:
            raise ValueError(f"the model returned {len(out)} outputs for a batch of {n}")
        return [out[i] for i in range(n)]
    raise TypeError(f"cannot split a batch output of type {type(out).__name__}: override infer() to return one output per item")
