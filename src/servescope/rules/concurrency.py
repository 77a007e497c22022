"""The causes whose lever is concurrency (no-batching, event-loop-blocked, gil-contention):
their savings are stated at the concurrency the doctor ran, where they hold (queueing
removed, throughput gained), never as a per-request figure at one caller."""

from __future__ import annotations

from dataclasses import replace

from ..doctor.evidence import BatchProbe, Concurrent, Evidence, MissingEvidence
from ..report import Finding
from .causes import (
    GIL_CORES,
    GIL_FLOOR_MS,
    GIL_IDLE_SHARE,
    GIL_MIN_REQUEST_MS,
    GIL_MIN_WIDTH,
    GIL_ONE_CORE,
    GIL_SCALING,
    GIL_SHARE,
    GIL_WAIT_MS,
    LOOP_BUSY_RUN_MS,
    LOOP_BUSY_SHARE,
    LOOP_STALL_HIGH_MS,
    NO_BATCHING_FLOOR_MS,
    NO_BATCHING_GAIN,
    own_line_fix,
)
from .idioms import batch_fix
from .savings import alone_and_together, measured_or_estimated, p50_at_loads, rates

__all__ = ["event_loop_blocked", "gil_contention", "no_batching"]


def _per_item_at(per_item: dict[str, float], n: int) -> tuple[int, float] | None:
    """The batch probe's per-item time at the largest size it ran that is <= n."""
    sizes = sorted(int(k) for k in per_item if int(k) <= n)
    return (sizes[-1], per_item[str(sizes[-1])]) if sizes else None


def _after_per_item_calls(ev: Evidence, per_request: float, best_batch: int | None, estimate: float | None) -> tuple[float | None, str]:
    """The estimate, and what to say of it, where a request's calls are its own items run one
    at a time and one call for them all measured a saving (per-item-calls): that fix batches
    first. Once one call a request holds as many items as the batch probe's best batch,
    merging requests is not estimated (a churn scorer's 40 rows a request: 665-868 ms said at
    c=8 from 320 calls a round, which one call a request mostly takes away)."""
    items = ev.tried("batch-items")
    if items is None or (items.saving_ms or 0.0) <= 0 or per_request < 2:
        return estimate, ""
    if best_batch and per_request >= best_batch:
        return None, (
            f" Not estimated: the {per_request:g} calls a request are its own items (per-item-calls); in one call they make a "
            f"batch of {per_request:g}, at least the batch probe's best ({best_batch}), and what merging requests adds after "
            "that was not measured."
        )
    return estimate, " This is the endpoint as written: one call a request for its items (per-item-calls) takes part of it first."


def no_batching(ev: Evidence) -> list[Finding]:
    conc = ev.need("concurrent")
    ev.need_probes("torch module hooks")
    fwd = conc.forwards
    if fwd is None:
        raise ev.missing_error("concurrent.forwards", "the model's calls are not visible from outside the process")
    # most requests ran a forward of their own (a runtime that batches on a worker and runs
    # only the odd lone request in the request's own context shows few forwards here)
    own = fwd.count * 2 >= max(conc.requests, 1)
    if conc.concurrency < 2 or not own or fwd.max_batch > 1:
        return []
    probe = ev.need("batch_probe")
    if probe.error:
        raise ev.missing_error("batch_probe", f"the batch probe failed: {probe.error}")
    one = probe.per_item_ms.get("1")
    if not probe.gain or probe.gain < NO_BATCHING_GAIN or one is None:
        return []
    # per forward, times the forwards each request runs (a decode loop runs many)
    per_forward = one * (1 - 1 / probe.gain) * max(fwd.per_request, 1.0)
    if per_forward < NO_BATCHING_FLOOR_MS:
        return []  # a fraction of a millisecond per item: batching is not this endpoint's problem
    n = conc.concurrency
    at = _per_item_at(probe.per_item_ms, n)
    alone, p50, measured = alone_and_together(ev)  # (both as a server shows them where the bare run finished)
    estimate, basis = None, ""
    if at is not None and p50:
        # with the N callers' items in one forward, each request waits about one batched
        # forward (N x its per-item time) plus its own work outside the model
        size, per_item = at
        model_now = one * max(fwd.per_request, 1.0)
        outside = max((alone or 0.0) - model_now, 0.0)
        after = n * per_item * max(fwd.per_request, 1.0) + outside
        # never more than the model's own time that batching takes out of a round of N
        # requests: where the work outside the model queues too (a load or Python code that
        # holds the GIL), the wait at c=N is mostly that work's, and batching leaves it
        bound = n * (one - per_item) * max(fwd.per_request, 1.0)
        estimate = round(max(min(p50 - after, bound), 0.0), 3)
        basis = (
            f"the batch probe: {n} callers' items in one forward of {size} would take about {n * per_item:.3g} ms "
            f"({per_item:.3g} ms per item, against {one:.3g} ms alone), so each request would wait about {after:.3g} ms "
            f"instead of the {p50:.3g} ms p50 measured at c={n} ({measured})"
        )
        if p50 - after > bound:
            basis += (
                f"; but batching takes only the model's time out of a round of {n} requests ({n} x ({one:.3g} - {per_item:.3g}) ms"
                f" = {bound:.3g} ms): the rest of that wait is the requests' work outside the model, queued"
            )
    # a streamed answer made by many forwards each: every stream runs its own decoding loop
    decoding = fwd.per_request >= 2 and ev.warm is not None and ev.warm.first_chunk_p50_ms is not None
    estimate, after_items = _after_per_item_calls(ev, fwd.per_request, probe.best_batch, estimate)
    saving = measured_or_estimated(ev, "batching", estimate_ms=estimate, estimated_from=basis, load=f"c={n}", p50_ms=p50)
    return [
        Finding(
            "no-batching",
            saving.severity() if saving.ms or saving.basis == "measured" else "low",  # (measured: no gain is info)
            "Concurrent streams each decode alone: every step is a batch-of-one forward"
            if decoding else "Concurrent requests each run their own batch-of-one forward",
            {
                "concurrency": conc.concurrency,
                "forward_batch_sizes": fwd.batch_sizes,
                "per_item_ms_at_batch_1": one,
                "forwards_per_request": fwd.per_request,
                "best_batch": probe.best_batch,
                "per_item_gain": probe.gain,
            },
            fix=_DECODE_FIX if decoding else batch_fix(fwd.kinds, fwd.calls, fwd.frames > 0),
            saving_ms=saving.ms or None,
            detail=f"Replaying the captured input, one forward of batch {probe.best_batch} costs {probe.gain:.1f}x less per item than batch 1. "
            + _fewer_threads_note(probe)
            + (saving.detail + after_items).strip(),
            **(saving.fields() if saving.ms else {}),
        )
    ]


def _fewer_threads_note(probe: BatchProbe) -> str:
    """Said when the batch probe's best size ran faster on the smaller torch pool it also tried
    (a busy machine): the gain is the one batching gives at that thread count."""
    best = str(probe.best_batch)
    fewer, default = probe.per_item_ms_fewer_threads.get(best), probe.per_item_ms.get(best)
    if probe.fewer_threads is None or fewer is None or default is None or fewer > default:
        return ""
    return (
        f"(Beside the other processes, batch {best} ran faster at torch.set_num_threads({probe.fewer_threads}) than at the "
        "default threads, whose batched calls stall on the thread that shares a core: the gain is batching's at that "
        "thread count.) "
    )


#: Idle cores under this, while the loop ran the requests at concurrency: no room for them on threads
NO_ROOM_IDLE_CORES = 0.5

_DECODE_FIX = (
    "# let concurrent streams share each decoding step: a Model whose infer yields one step for the\n"
    "# whole batch (examples/serve/generate.py is this, whole), its streams batched step by step\n"
    "class Generate(servescope.Model):\n"
    "    def infer(self, batch):\n"
    "        ids, mask, cache = batch['input_ids'], batch['attention_mask'], None\n"
    "        for step in range(int(batch['max_tokens'].max())):\n"
    "            out = self.model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)\n"
    "            cache, ids = out.cache, out.logits[:, -1:].argmax(-1)\n"
    "            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)\n"
    "            yield ids[:, 0]                  # each request's next token, sent to it at once\n"
    "app = servescope.serve(Generate(), max_batch_size=16, openai='my-model')\n"
    "# or, for a model it supports, an LLM server with continuous batching (vLLM, TGI, SGLang)"
)

_LOOP_FIX = (
    "# an `async def` endpoint runs on the loop: make it a plain `def` (FastAPI runs it in a\n"
    "# thread pool), or hand the heavy call off:\n"
    "@app.post('/predict')\n"
    "async def predict(payload: Payload):\n"
    "    return await asyncio.to_thread(run_model, payload)\n"
    "# a big response is encoded on the loop even for `def` endpoints: return\n"
    "# Response(orjson.dumps(...)) built inside the endpoint instead"
)
_STREAM_FIX = (
    "# the streamed answer's `async def` generator runs each step on the event loop (a `def`\n"
    "# endpoint does not change that): make the generator a plain `def` (Starlette runs each\n"
    "# step on its thread pool) ...\n"
    "def tokens():\n"
    "    for _ in range(max_tokens):\n"
    "        yield decode_step()\n"
    "return StreamingResponse(tokens(), media_type='text/event-stream')\n"
    "# ... or hand each step off inside it: token = await asyncio.to_thread(decode_step)\n"
    "# (servescope.serve runs a model that yields off the loop, its streams batched step by step)"
)


def event_loop_blocked(ev: Evidence) -> list[Finding]:
    conc = ev.need("concurrent")
    if conc.forwards is None and conc.loop is None:
        raise ev.missing_error("concurrent.loop", "the event loop is not visible from outside the process")
    on_loop = conc.forwards.on_event_loop if conc.forwards else 0
    loop = conc.loop
    # the model ran on the loop for most requests under concurrency (a runtime that runs only
    # a lone request there, when nothing else waits, blocks nobody) ...
    model_on_loop = on_loop * 2 >= max(conc.requests, 1)
    # ... or the loop's own thread was seen running code (not waiting for I/O or the GIL)
    # for a large share of the phase, in long runs, and a task on it woke that late: a loop
    # kept busy by many short callbacks (a fast endpoint under load) wakes its tasks on time
    busy = (
        loop is not None
        and loop.busy_share >= LOOP_BUSY_SHARE
        and loop.longest_busy_ms >= LOOP_BUSY_RUN_MS
        and (conc.loop_lag_max_ms or 0.0) >= LOOP_BUSY_RUN_MS
    )
    if not (model_on_loop or busy):
        return _loop_waits(ev, conc)
    streamed = ev.warm is not None and ev.warm.first_chunk_p50_ms is not None
    forward = (conc.forwards.mean_ms if conc.forwards else None) or 0.0
    busy_per_request = (loop.busy_share * 1000 / conc.throughput_rps) if loop and conc.throughput_rps else 0.0
    together = p50_at_loads(ev).get(f"c={conc.concurrency}")  # (as a server shows it: the probes slow the phase)
    estimate = min(max(forward if model_on_loop else 0.0, busy_per_request), together or ev.p50_ms or float("inf"))
    # a whole answer (not its first chunk) waits on throughput: with no core idle, on worker
    # threads the requests would share the same cores and wait as long (an `async def` MiniLM
    # forward on 2 busy cores: off the loop its p50 at c=8 rose from 75 to 105 ms)
    idle = conc.machine_cores_idle
    full = not streamed and idle is not None and idle < NO_ROOM_IDLE_CORES
    saving = measured_or_estimated(
        ev, "off-the-loop", estimate_ms=None if full else round(estimate, 3) or None, load=f"c={conc.concurrency}", p50_ms=together,
        estimated_from="the time the loop's thread ran the handler's code per request (the wait it puts on the others)",
    )  # fmt: skip
    if full and saving.basis == "estimated":
        room = (
            f"No saving is estimated at c={conc.concurrency}: the machine had {idle:.2g} of a core idle while the loop ran, "
            "so on worker threads the requests would share the same cores and wait about as long."
        )
        saving = replace(saving, detail=f"{room} {saving.detail}".strip())
    evidence = {
        "forwards_on_the_loop": on_loop,
        "requests": conc.requests,
        "loop_busy_share": loop.busy_share if loop else None,
        "longest_busy_ms": loop.longest_busy_ms if loop else None,
        "loop_blocked_max_ms": conc.loop_lag_max_ms,
        "sequential_rps": conc.sequential_rps,
        "concurrent_rps": conc.throughput_rps,
    }
    if loop and loop.hot_spot:
        evidence["on_the_loop"] = loop.hot_spot
    sev = saving.severity() if saving.ms else "info"
    stall = ""
    if loop is not None and loop.longest_busy_ms >= LOOP_STALL_HIGH_MS and sev in ("info", "low"):
        # every other request on the loop (a health check, another route) waited that long
        sev = "medium"
        stall = (
            f" Whatever it saves on this route, the loop ran {loop.longest_busy_ms:.0f} ms at a stretch: every other "
            "request to this process (a health check, another route) waited that long."
        )
    return [
        Finding(
            "event-loop-blocked",
            sev,
            "Heavy synchronous work runs on the event loop: concurrent requests queue behind it",
            evidence,
            fix=_STREAM_FIX if streamed else _LOOP_FIX,
            saving_ms=saving.ms or None,
            detail=(saving.detail + stall).strip(),
            **(saving.fields() if saving.ms else {}),
        )
    ]


_WAIT_FIX = (
    "# a blocking wait inside async code stops the loop: iterate the blocking iterator off it,\n"
    "# in a plain `def` generator (Starlette runs each step on its thread pool) ...\n"
    "def tokens():\n"
    "    for text in streamer:              # a TextIteratorStreamer's queue.get blocks\n"
    "        yield text\n"
    "return StreamingResponse(tokens())\n"
    "# ... or hand each wait off: text = await asyncio.to_thread(next, iterator, None)\n"
    "# (transformers: AsyncTextIteratorStreamer, read with `async for`, does not block)"
)


def _loop_waits(ev: Evidence, conc: Concurrent) -> list[Finding]:
    """event-loop-blocked by a wait: the loop's own thread stopped in a blocking call (a
    queue's get, a lock, a socket read) for a large share of the concurrent phase, in long
    runs, while a task on the loop woke that late. Sized as what concurrent requests waited
    more than one alone: time to first chunk for a streamed answer, else the p50."""
    loop = conc.loop
    if loop is None or loop.waiting_share < LOOP_BUSY_SHARE or loop.longest_wait_ms < LOOP_BUSY_RUN_MS:
        return []
    if (conc.loop_lag_max_ms or 0.0) < LOOP_BUSY_RUN_MS:
        return []
    streamed = ev.warm is not None and ev.warm.first_chunk_p50_ms is not None and conc.first_chunk_p50_ms is not None
    alone, together, measured = alone_and_together(ev, first_chunk=streamed)  # (both alike: with the probes or without)
    what = "time to the first chunk" if streamed else "latency"
    estimate = round(max(together - alone, 0.0), 3) if together is not None and alone is not None else None
    # (an estimate only: the off-the-loop experiment moves model calls, which are not what waits here)
    saving = measured_or_estimated(
        ev, "", estimate_ms=estimate or None, load=f"c={conc.concurrency}" + (", first chunk" if streamed else ""),
        p50_ms=together, estimated_from=f"the {what} at c={conc.concurrency} ({together or 0:.4g} ms p50) less alone ({alone or 0:.4g} ms), {measured}: "
        "what the others waited while the loop's thread was stopped, as if they ran as one did alone",
    )  # fmt: skip
    return [
        Finding(
            "event-loop-blocked",
            saving.severity() if saving.ms else "medium",
            "The event loop's thread stops in a blocking wait inside async code: concurrent requests queue behind it",
            {
                "loop_waiting_share": loop.waiting_share,
                "longest_wait_ms": loop.longest_wait_ms,
                "loop_blocked_max_ms": conc.loop_lag_max_ms,
                "waiting_in": loop.waiting_in,
                "requests": conc.requests,
            },
            fix=_WAIT_FIX,
            saving_ms=saving.ms or None,
            detail=(
                f"During the c={conc.concurrency} phase the loop's own thread was stopped in a blocking wait (not its "
                f"selector) for {loop.waiting_share:.0%} of the samples, {loop.longest_wait_ms:.0f} ms at a stretch, in "
                f"{loop.waiting_in}; a task on the loop woke up to {conc.loop_lag_max_ms:.0f} ms late. " + saving.detail
            ).strip(),
            **(saving.fields() if saving.ms else {}),
        )
    ]


_GIL_FIX = (
    "# the hot spot is Python code, so threads take turns on one core:\n"
    "# vectorise it (numpy/torch ops release the GIL), or run it in processes:\n"
    "pool = concurrent.futures.ProcessPoolExecutor()\n"
    "result = await loop.run_in_executor(pool, cpu_heavy_part, data)\n"
    "# or serve with several worker processes (uvicorn --workers N, gunicorn -w N); they\n"
    "# share one socket, and a few keep-alive clients that connect at once may all be\n"
    "# accepted by one worker: check the load spreads (many clients, or new connections, do)"
)


def _gil_fix(ev: Evidence) -> str:
    """The user's own hot line first where the sampler found one an idiom replaces (that line
    is the Python work that holds the GIL), then the general fix."""
    own = own_line_fix(ev)
    return f"{own}\n{_GIL_FIX}" if own else _GIL_FIX


#: doctor --pid: the GIL held this share of the time while this many threads, on average,
#: worked on requests: they take turns
GIL_HELD_SHARE, GIL_THREADS = 0.8, 1.5


def _gil_from_stacks(ev: Evidence, conc: Concurrent) -> list[Finding]:
    """gil-contention as a live process's samples show it (doctor --pid): py-spy's ``--gil``
    recording says how much of the time one of its threads held the GIL, the stacks how many
    threads worked on requests meanwhile, /proc how many cores the process used."""
    held, inside, cores = conc.gil_busy_share, conc.threads_in_requests, conc.cpu_cores_busy
    if held is None or inside is None or cores is None:
        raise ev.missing_error("concurrent.cpu", "the GIL's use was not sampled")
    width = min(max(conc.concurrency, round(inside)), int(ev.machine.cpus_available or 1) if ev.machine else 1)
    if width < 2 or inside < GIL_THREADS or held < GIL_HELD_SHARE or cores >= GIL_CORES * width:
        return []  # one thread at a time, a GIL often free, or native code running in parallel
    if conc.loop is not None and conc.loop.busy_share >= LOOP_BUSY_SHARE:
        return []  # the loop is the bottleneck: event-loop-blocked says so
    warm = ev.warm
    if warm is not None and warm.loads_per_request >= 0.5:
        return []  # the Python work is the per-request load: model-load-per-request's fix removes it
    service = None
    if conc.throughput_rps and conc.sequential_rps:
        service = round(1000 / conc.throughput_rps - 1000 / (conc.sequential_rps * width), 3)
    evidence = {"gil_held_share": held, "threads_in_requests": inside, "cpu_cores_busy": cores, "concurrency": conc.concurrency,
                "sequential_rps": conc.sequential_rps, "concurrent_rps": conc.throughput_rps}  # fmt: skip
    if conc.worker_hot_spot:
        evidence["hot_spot"] = conc.worker_hot_spot
    detail = (
        f"Sampled from outside: one of the process's threads held the GIL {held:.0%} of the time while {inside:.1f} threads "
        f"on average worked on requests, and the process used {cores:.2f} cores: the requests' Python code ran one "
        "thread at a time."
    )
    if service is not None and service > 0:
        detail += f" Estimated from the server time per request now against {width} requests at once (c={conc.concurrency}, server time)."
    return [
        Finding(
            "gil-contention",
            "high" if held >= 0.95 else "medium",
            "Pure-Python work holds the GIL: concurrent requests run one at a time",
            evidence,
            fix=_gil_fix(ev),
            saving_ms=service if service is not None and service > 0 else None,
            detail=detail,
            **({"saving_basis": "estimated", "saving_load": f"c={conc.concurrency}, server time"} if service and service > 0 else {}),
        )
    ]


def gil_contention(ev: Evidence) -> list[Finding]:
    if ev.target_kind == "pid":
        return _gil_from_stacks(ev, ev.need("concurrent"))
    conc, env = ev.need("concurrent"), ev.need("environment")
    if conc.cpu_cores_busy is None or conc.gil_wait_p50_ms is None:
        raise ev.missing_error("concurrent.cpu", "CPU time and GIL waits are not visible from outside the process")
    cpus = env.cpus_available or 1
    # requests that could run at once: one alone may already keep more than a core busy
    # (torch's intra-op threads), and then more processes have only the rest to gain (up to
    # GIL_ONE_CORE it is one core's worth: the doctor's sampler and client run beside it)
    # (measured without the probes, the sampler and the doctor's client where that run finished)
    alone_cores = conc.served_alone_cores or (ev.warm.cpu_cores_busy if ev.warm is not None else None)
    alone = alone_cores if alone_cores and alone_cores >= GIL_ONE_CORE else 1.0
    cores = min(conc.concurrency, int(cpus))  # (the CPUs the callers could keep busy)
    width = min(float(conc.concurrency), int(cpus) / alone)
    sequential, rps, measured = rates(ev)  # (one caller and N alike: both as a server serves them, or both probed)
    if width < GIL_MIN_WIDTH or not rps or not sequential:
        return []
    if ev.p50_ms < GIL_MIN_REQUEST_MS:
        # a function's callers (and, for an app, the server's HTTP work) share the process's
        # GIL: on requests this short they are a large part of what holds it
        raise MissingEvidence(
            f"requests of {ev.p50_ms:.2g} ms are too short to tell the endpoint's hold on the GIL from the "
            "doctor's own work in the same process (it is measured from 5 ms)"
        )
    scaling = rps / sequential
    on_loop = conc.forwards.on_event_loop * 2 >= max(conc.requests, 1) if conc.forwards else False
    loop_busy = conc.loop is not None and conc.loop.busy_share >= LOOP_BUSY_SHARE
    if on_loop or loop_busy:
        return []  # the loop is the bottleneck (event-loop-blocked says so)
    warm = ev.warm
    if warm is not None and (warm.loads_per_request >= 0.5 or warm.params_built_per_request > 0):
        return []  # the Python work is the per-request load: model-load-per-request's fix removes it
    if not (0.5 <= conc.cpu_cores_busy < GIL_CORES * cores) or conc.gil_wait_p50_ms < GIL_WAIT_MS:
        return []  # the CPUs are busy (native code in parallel), idle (waiting), or the GIL is free
    if scaling >= GIL_SCALING * width and conc.cpu_cores_busy >= GIL_ONE_CORE:
        # it scales, and its CPU says how: more than one core's worth ran at once. (Where the
        # process used one core's worth, a throughput that looks scaled came from waits that
        # overlap, or from a sequential phase that other work slowed: the two phases are
        # measured apart, the CPU and the GIL's waits in the same one. The saving below is
        # then small, and the floor judges it.)
        return []
    unused = cores - conc.cpu_cores_busy
    if conc.machine_cores_idle is not None and conc.machine_cores_idle < GIL_IDLE_SHARE * unused:
        # the cores this process left unused were not idle: other processes ran on them, and a
        # thread late for the GIL is as late when the OS has no CPU to give it
        raise MissingEvidence(
            f"the machine's CPUs were busy with other processes during the concurrent phase "
            f"({conc.machine_cores_idle:.2f} cores idle while this process used {conc.cpu_cores_busy:.2f} of "
            f"{cores}), so threads waiting for the GIL cannot be told from threads waiting for a CPU"
        )
    # service time per request as served now, and if `width` callers could run at once
    service = 1000 / rps - 1000 / (sequential * width)
    if service < GIL_FLOOR_MS or service < GIL_SHARE * ev.p50_ms:
        return []
    saving = measured_or_estimated(  # (server time per request, not a p50: never added to the p50 savings at c=N)
        ev, "processes", estimate_ms=round(service, 3), load=f"c={conc.concurrency}, server time", p50_ms=1000 / rps,
        estimated_from=f"the server time per request now ({1000 / rps:.3g} ms) against {width:.3g} requests at once, {measured}",
    )  # fmt: skip
    evidence = {
        "concurrency": conc.concurrency,
        "sequential_rps": sequential,
        "concurrent_rps": rps,
        "rates_measured": measured,
        "scaling": round(scaling, 2),
        "cores_one_request_alone": alone_cores,
        "cpu_cores_busy": conc.cpu_cores_busy,
        "cpus_available": cpus,
        "gil_wait_p50_ms": conc.gil_wait_p50_ms,
        "machine_cores_idle": conc.machine_cores_idle,
    }
    if conc.worker_hot_spot:
        evidence["hot_spot"] = conc.worker_hot_spot
    return [
        Finding(
            "gil-contention",
            saving.severity(),
            "Pure-Python work holds the GIL: concurrent requests run one at a time",
            evidence,
            fix=_gil_fix(ev),
            saving_ms=saving.ms,
            **saving.fields(),
            detail=f"{conc.concurrency} callers got {scaling:.2f}x the throughput of one while the process used "
            f"{conc.cpu_cores_busy:.2f} of {cpus:g} CPUs, and a thread that only wanted the GIL waited "
            f"{conc.gil_wait_p50_ms:.1f} ms for it (p50). The saving is server time per request if "
            f"{width:.3g} requests could run at once. " + saving.detail,
        )
    ]
