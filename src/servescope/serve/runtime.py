"""What the worker does with a batch: preprocess, collate, copy, forward, split, postprocess,
serialize, each timed; one item's failure stays that item's.

The batch's shape on the way (collate, the copies, split, serialize) is collate.py's; a model
that yields is streamed by the ``Streaming`` methods (streaming.py). torch is imported only
when the user's model is a torch model or returns tensors.
"""

from __future__ import annotations

import inspect
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

from ..environment import available_cpus
from ..openmp import prefer_passive_wait
from ..timing import OTHER, Trace, resolve_clock, stage
from .batching import Item
from .collate import (
    NonFiniteOutput,
    _is_tensor,
    _nonfinite,
    _torch,
    collate,
    serialize,
    split,
    to_device,
    to_host,
)
from .lanes import Lanes
from .model import Model
from .streaming import _END, _FAILED, Streaming, _fail, _Steps
from .threads import ThreadTuner, thread_choice, thread_choices

__all__ = ["Runtime", "collate", "split"]

log = logging.getLogger("servescope")
#: A forward whose padding would pass this share of it is split (length-aware batching).
MAX_PADDING_SHARE = 0.25
#: forwards per lane a batch is cut into at least (serve/lanes.py), and a forward's cost beside
#: its tokens (items x the longest), in tokens: MiniLM on one thread took ~3 ms + 225 us a token
LANE_FORWARDS, LANE_FIXED_COST = 3, 16
_WALL = resolve_clock("wall", None)  # the per-item hooks run on the host: no device clock, no sync


class Runtime(Streaming):
    """Loads the model once, warms it up, and processes batches for the Batcher."""

    def __init__(
        self, model: Model, *, device: str | None = None, threads: int | None = None, max_batch_tokens: int | None = None, lanes: int | None = None
    ) -> None:
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
        self.requested_lanes = lanes
        #: forwards run in parallel when a batch has several (``start_lanes``); None: one at a time
        self.lanes: Lanes | None = None
        self._pinned_threads = threading.local()

    # -- start-up ----------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """Pick the device and threads, load once, eval(), and say what was picked."""
        self.wait = prefer_passive_wait()  # (before torch is imported here or by the model's load())
        self.info.update(self.wait.as_info())
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
        self.info["uses_torch"] = torch is not None and _holds_torch(torch, [loaded, *vars(self.model).values()])
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

    def start_lanes(self) -> tuple[int, str]:
        """From now on (after warm-up) run a batch's forwards in parallel lanes (serve/lanes.py):
        ``lanes=`` as given, else two for a torch model on 2+ CPUs whose threads are adapted
        here (torch's per-forward scaling is what lanes beat); one for a model that yields (its
        steps advance one stream at a time) and where the user fixed the threads. Returns the
        count and why."""
        if inspect.isgeneratorfunction(self.model.infer) or inspect.isgeneratorfunction(self.model.postprocess):
            return 1, "a model that yields streams one step at a time"
        if self.requested_lanes is not None:
            count, why = self.requested_lanes, "lanes="
        elif self.tuner is not None:
            count, why = 2, "torch on the CPU, its threads adapted here"
        elif self.device != "cpu":
            return 1, f"the model is on {self.device}"
        elif not self.info.get("uses_torch"):
            return 1, "not a torch model: its library runs its own threads (lanes=N to run N forwards at once)"
        elif self.info.get("threads_from") != "the CPUs available":
            return 1, f"the threads were fixed ({self.info.get('threads_from')})"
        else:
            return 1, "one CPU"
        if count > 1:
            self.lanes = Lanes(count)
        return count, why

    def _lane_threads_total(self) -> int:
        """The threads the lanes share: the tuner's count now, else the count fixed at start-up."""
        return self.tuner.current if self.tuner is not None else int(self.info.get("torch_threads") or 1)

    def _pin(self, n: int) -> None:
        """This thread's forwards at ``n`` torch threads (set only when it changes)."""
        if self.tuner is not None:
            self.tuner.pin(n)
            return
        torch = _torch()
        if torch is not None and getattr(self._pinned_threads, "n", None) != n:
            torch.set_num_threads(n)
            self._pinned_threads.n = n

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
        lanes = self.lanes
        lengths = [model.length(x) for x in inputs]  # (once a batch: grouping, the lanes' order, the tuner)
        # in lanes, at least LANE_FORWARDS forwards per lane: small enough to end the lanes together
        groups = self._groups(inputs, -(-len(inputs) // (LANE_FORWARDS * lanes.count)) if lanes is not None else None, lengths)
        parts = [([live[i] for i in g], [inputs[i] for i in g], _tokens([lengths[i] for i in g])) for g in groups]
        if lanes is not None and len(parts) > 1:
            self._in_lanes(parts, ready, delivered)
            return
        for part in parts:  # similar lengths share a forward
            self._deliver(part[0], self._forward_from(ready, *part), delivered)

    def _forward_from(self, ready: int, members: list[Item], inputs: list[Any], tokens: int | None, threads: int = 0) -> list[Any]:
        """One forward of the batch, its wait since the batch was ready counted as queueing."""
        waited = time.perf_counter_ns() - ready  # for the batch's earlier forwards: queueing too
        for it in members:
            it.durations["queue"] = it.durations.get("queue", 0) + waited
        if self.on_forward is not None:
            self.on_forward(len(members))
        return self._forward(members, inputs, threads, tokens)

    def _deliver(self, members: list[Item], outs: list[Any], delivered: set[int]) -> None:
        """A forward's items postprocessed, serialized and answered (on the worker thread)."""
        streams = []
        for it, out in zip(members, outs):
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

    def _in_lanes(self, parts: list[_Part], ready: int, delivered: set[int]) -> None:
        """The batch's forwards shared between the lanes (serve/lanes.py), each at its share of
        the threads; every forward's items answered here, on the worker thread, as it ends."""
        lanes = self.lanes
        assert lanes is not None
        threads = max(1, self._lane_threads_total() // lanes.count)
        todo = lanes.order([(tokens or len(members)) + LANE_FIXED_COST for members, _, tokens in parts])
        done: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        def take() -> int | None:
            try:
                return todo.popleft()  # (atomic: the lanes share it without a lock)
            except IndexError:
                return None

        def helper() -> None:
            while (k := take()) is not None:
                try:
                    done.put((k, self._forward_from(ready, *parts[k], threads)))
                except BaseException as exc:  # a bug of ours: the worker raises it
                    done.put((k, exc))

        for lane in range(1, lanes.count):
            lanes.submit(lane, helper)  # (a helper still in a stuck forward: the others share its part)
        left = len(parts)
        while (k := take()) is not None:
            self._deliver(parts[k][0], self._forward_from(ready, *parts[k], threads), delivered)
            left -= 1
            while not done.empty():
                left -= 1
                self._deliver_from_lane(done.get(), parts, delivered)
        while left:
            left -= 1
            self._deliver_from_lane(done.get(), parts, delivered)

    def _deliver_from_lane(self, result: tuple[int, Any], parts: list[_Part], delivered: set[int]) -> None:
        k, outs = result
        if isinstance(outs, BaseException):
            raise outs
        self._deliver(parts[k][0], outs, delivered)

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

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under ``torch.inference_mode()`` where torch is in use."""
        torch = _torch()
        if torch is None:
            return fn(*args)
        with torch.inference_mode():
            return fn(*args)

    def _groups(self, inputs: list[Any], max_items: int | None = None, lengths: list[int | None] | None = None) -> list[list[int]]:
        """The batch's items (their indexes) in forwards of similar length: sorted by length,
        a forward ends where adding the next item would make padding more than
        ``MAX_PADDING_SHARE`` of it, or its tokens (items x the longest) pass
        ``max_batch_tokens``, or it has ``max_items`` (lanes: many similar forwards of a few
        items each). Inputs without a length (or of one length) stay one forward: a model whose
        inputs have one shape gains by batching alone."""
        n = len(inputs)
        if n < 2:
            return [list(range(n))] if n else []
        if lengths is None:
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
            if over_budget or max_items is not None and size > max_items or padded - (useful + longest) > MAX_PADDING_SHARE * padded:  # type: ignore[operator]
                groups.append([i])
                useful = longest
            else:
                groups[-1].append(i)
                useful += longest  # type: ignore[operator]
        return groups

    def _forward(self, items: list[Item], inputs: list[Any], threads: int = 0, tokens: int | None = None) -> list[Any]:
        """Collate, copy, forward, copy back and split; on failure retry one by one. A model
        that yields streams its items' answers here (their outputs are ``_STREAMED``)."""
        try:
            outs = self._batched(items, inputs, threads, tokens)
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
                out = self._batched([it], [x], threads, _tokens([self.model.length(x)]))
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

    def _batched(self, items: list[Item], inputs: list[Any], threads: int = 0, tokens: int | None = None) -> list[Any] | _Steps:
        # one trace for the batch, on the device's clock: the model's own servescope.stage()s
        # inside collate or infer count under their names; every item waited for all of it
        batch_trace = Trace(clock=self.clock)
        steps = None
        try:
            with batch_trace:
                with stage("to_device"):
                    batch = self._to_device(self.model.collate(inputs))
                with stage("infer"):
                    tuner = None
                    if threads:  # a forward in a lane: its share of the threads, not the tuner's count
                        self._pin(threads)
                    elif self.tuner is not None:
                        tuner = self.tuner
                        threads = tuner.next()
                    elif self.lanes is not None:  # alone: all of them again
                        self._pin(self._lane_threads_total())
                    t0 = time.perf_counter_ns()
                    out = self._call(self.model.infer, batch)
                    if inspect.isgenerator(out):  # infer yields: its first step is this forward
                        steps = _Steps(out, self._call(next, out, _END))
                    if tuner is not None:
                        tuner.record(threads, time.perf_counter_ns() - t0, len(items), None if steps is not None else tokens)
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


#: one forward of a batch: its items, their inputs, and its tokens (``_tokens``)
_Part = tuple[list[Item], list[Any], "int | None"]


def _tokens(lengths: list[int | None]) -> int | None:
    """A forward's items x its longest input, when every input has a length (else None)."""
    return None if not lengths or any(n is None for n in lengths) else len(lengths) * max(lengths)  # type: ignore[type-var, operator]


def _holds_torch(torch: Any, values: list[Any]) -> bool:
    """Whether any of ``values`` is a torch module or tensor, or holds one (a pipeline's
    ``.model``, a tuple or dict of them): the model runs on torch's threads."""
    kinds = (torch.nn.Module, torch.Tensor)
    for v in values:
        inner = list(v.values())[:16] if isinstance(v, dict) else list(v[:16]) if isinstance(v, (list, tuple)) else [getattr(v, "model", None)]
        if isinstance(v, kinds) or any(isinstance(x, kinds) for x in inner):
            return True
    return False


def _takes_two(method: Any) -> bool:
    """Whether a bound method takes two positional arguments (``postprocess(output, request)``)."""
    import inspect

    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
