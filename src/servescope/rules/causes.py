"""One function per cause: ``rule(evidence) -> list[Finding]``.

Presence is decided by evidence that does not move with timing noise (a loader ran on warm
requests, a forward ran in training mode or on the event loop); timings size the saving
and the severity, so a cause that is there is listed every run (at ``info`` when it costs
nothing measurable). A rule that needs a measurement the run does not have calls
``ev.need(...)``, which raises ``MissingEvidence``: the report lists it as not checked.
"""

from __future__ import annotations

from ..doctor.evidence import Evidence, MissingEvidence
from ..report import Finding

#: Thresholds (docs/doctor.md).
NO_BATCHING_GAIN, NO_BATCHING_FLOOR_MS = 1.3, 0.2
COLD_RATIO, COLD_EXTRA_MS = 3.0, 50.0
LOOP_BUSY_SHARE, LOOP_BUSY_RUN_MS, LOOP_STALL_HIGH_MS = 0.3, 20.0, 50.0
GIL_SCALING, GIL_CORES, GIL_WAIT_MS, GIL_FLOOR_MS, GIL_SHARE = 0.7, 0.75, 1.0, 1.0, 0.1
GIL_MIN_REQUEST_MS = 5.0
GIL_IDLE_SHARE = 0.5  # of the cores the process left unused, the share that must have been idle
FAILING_HIGH = 0.1
REPEATED_SHARE = 0.01
PADDING_SHARE = 0.5
MODEL_CALLS = ("torch module hooks", "onnxruntime", "scikit-learn", "sentence-transformers", "transformers.pipeline")


def severity(saving_ms: float, p50_ms: float) -> str:
    """How bad, from the share of the request's p50 the fix would save."""
    share = saving_ms / p50_ms if p50_ms > 0 else 0.0
    if share >= 0.5:
        return "critical"
    if share >= 0.2:
        return "high"
    if share >= 0.05:
        return "medium"
    if share >= 0.01:
        return "low"
    return "info"


def failing_requests(ev: Evidence) -> list[Finding]:
    warm, conc = ev.need("warm"), ev.concurrent
    sent = warm.requests + (conc.requests if conc else 0)
    failed = warm.errors + (conc.errors if conc else 0)
    if not failed:
        return []
    share = max(warm.errors / max(warm.requests, 1), (conc.errors / max(conc.requests, 1)) if conc else 0.0)
    only_concurrent = warm.errors == 0
    return [
        Finding(
            "failing-requests",
            "high" if share >= FAILING_HIGH or only_concurrent else "medium",
            "Some requests fail" + (" only when several run at once" if only_concurrent else ""),
            {
                "failed": failed,
                "sent": sent,
                "warm_failed": warm.errors,
                "concurrent_failed": conc.errors if conc else 0,
                "first_errors": " | ".join(warm.errors_sample) or "-",
            },
            fix=(
                "# the figures above are from the requests that succeeded; fix the failures first\n"
                + ("# failing only under concurrency: shared state that is not thread-safe (a tokenizer,\n"
                   "# a cache, a model moved per request); guard it or give each worker its own"
                   if only_concurrent else "# run one request by hand with the same payload to see the traceback")
            ),
            detail="Failed requests are kept out of the latency figures and counted by kind under Errors.",
        )
    ]


def model_load_per_request(ev: Evidence) -> list[Finding]:
    warm = ev.need("warm")
    ev.need_probes("torch.load", "load_state_dict", "safetensors", "torch.jit.load", "from_pretrained", "SentenceTransformer", "Module.__init__")
    loads, built = warm.loads_per_request, warm.constructed_per_request
    if loads < 0.5 and not (built >= 1 and warm.params_built_per_request > 0):
        return []  # (modules without weights, nn.Softmax() per request, are not a model)
    saving = warm.load_ms_per_request + warm.construct_ms_per_request
    what = ", ".join(warm.load_calls) or "nn.Module construction"
    return [
        Finding(
            "model-load-per-request",
            severity(saving, ev.p50_ms),
            "The model is loaded again on every request",
            {
                "loads_per_request": loads,
                "modules_built_per_request": built,
                "weights_built_per_request": int(warm.params_built_per_request),
                "load_calls": what,
                "load_ms_per_request": round(saving, 3),
                "p50_ms": ev.p50_ms,
            },
            fix=(
                "# load once, at start-up, not inside the handler\n"
                "model = build_model()\n"
                "model.load_state_dict(torch.load(PATH, map_location=device))\n"
                "model.to(device).eval()\n\n"
                "def predict(payload):\n"
                "    with torch.inference_mode():\n"
                "        return model(prepare(payload))"
            ),
            saving_ms=round(saving, 3),
        )
    ]


def cold_start(ev: Evidence) -> list[Finding]:
    cold, warm = ev.need("cold"), ev.need("warm")
    p50 = ev.p50_ms
    if cold.error or not p50:
        return []
    lazy = (cold.loads > 0 or cold.params_built > 0) and (warm.loads_per_request < 0.5 and warm.params_built_per_request == 0)
    slow = cold.latency_ms >= COLD_RATIO * p50 and cold.latency_ms - p50 >= COLD_EXTRA_MS
    if not (lazy or slow):
        return []
    extra = max(cold.latency_ms - p50, 0.0)
    if cold.latency_ms >= 10 * p50 and extra >= 200:
        sev = "high"
    elif slow:
        sev = "medium"
    else:
        sev = "low" if extra >= COLD_EXTRA_MS else "info"
    return [
        Finding(
            "cold-start",
            sev,
            "The first request " + ("loads the model" if lazy else "is far slower than the rest") + ": no warm-up",
            {
                "first_ms": round(cold.latency_ms, 2),
                "p50_ms": p50,
                "ratio": round(cold.latency_ms / p50, 1),
                "loaded_on_first_request": lazy,
                "first_request_load_calls": ", ".join(cold.load_calls) or "-",
            },
            fix=(
                "# load and run one example at start-up, before the server reports ready\n"
                "model = load_model()\n"
                "with torch.inference_mode():\n"
                "    model(example_input)      # also each batch size you will use\n"
                "# servescope.serve(Model(), example=...) does both before /ready"
            ),
            saving_ms=round(extra, 2),
            saving_per="first request",
            detail="Only the first request pays this; "
            + ("the model is loaded lazily by it." if lazy else "first-call initialisation (allocation, tracing, kernels) runs in it."),
        )
    ]


def model_not_on_accelerator(ev: Evidence) -> list[Finding]:
    env, warm = ev.need("environment"), ev.need("warm")
    if not env.cuda_available:
        return []
    ev.need_probes("torch module hooks")
    fwd = warm.forwards
    if not fwd.count or any(d.startswith("cuda") for d in fwd.param_devices):
        return []
    probe = ev.batch_probe
    return [
        Finding(
            "model-not-on-accelerator",
            "high",
            "A GPU is available but the model runs on the CPU",
            {"param_devices": ", ".join(fwd.param_devices), "forward_ms": probe.forward_ms if probe else None},
            fix="device = torch.device('cuda')\nmodel = model.to(device).eval()   # once, at start-up\nx = x.to(device, non_blocking=True)",
            saving_ms=None,
        )
    ]


def repeated_transfer(ev: Evidence) -> list[Finding]:
    warm = ev.need("warm")
    ev.need_probes("Tensor.", "Module.to", "Module.cuda")
    copies = warm.h2d_per_request + warm.d2h_per_request
    problems: dict[str, float] = {}
    if warm.module_moves_per_request >= 1:
        problems["model_moved_per_request"] = warm.module_moves_per_request
    if warm.small_copies_per_request >= 4:
        problems["small_copies_per_request"] = warm.small_copies_per_request
    if warm.unpinned_async_per_request >= 1:
        problems["non_blocking_from_unpinned"] = warm.unpinned_async_per_request
    if warm.syncs_per_request >= 4:
        problems["sync_points_per_request"] = warm.syncs_per_request
    if copies > 4:
        problems["copies_per_request"] = copies
    if not problems:
        return []
    saving = sum((ev.stages.get(s) or {}).get("mean_ms") or 0.0 for s in ("to_device", "to_host"))
    return [
        Finding(
            "repeated-transfer",
            severity(saving, ev.p50_ms),
            "Host<->device copies are done piecemeal or synchronously",
            {**problems, "copy_bytes_per_request": warm.copy_bytes_per_request, "transfer_ms": round(saving, 3)},
            fix=(
                "# one copy in, one copy out, per batch\n"
                "x = torch.stack(items).pin_memory().to(device, non_blocking=True)\n"
                "y = model(x)\n"
                "y = y.cpu()            # once; no .item()/.tolist() per element on the GPU\n"
                "# and move the model once at start-up, never per request"
            ),
            saving_ms=round(saving, 3) or None,
        )
    ]


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
    saving = one * (1 - 1 / probe.gain) * max(fwd.per_request, 1.0)
    if saving < NO_BATCHING_FLOOR_MS:
        return []  # a fraction of a millisecond per item: batching is not this endpoint's problem
    return [
        Finding(
            "no-batching",
            severity(saving, ev.p50_ms),
            "Concurrent requests each run their own batch-of-one forward",
            {
                "concurrency": conc.concurrency,
                "forward_batch_sizes": fwd.batch_sizes,
                "per_item_ms_at_batch_1": one,
                "forwards_per_request": fwd.per_request,
                "best_batch": probe.best_batch,
                "per_item_gain": probe.gain,
            },
            fix=(
                "# let concurrent requests share one forward\n"
                "app = servescope.serve(MyModel(), max_batch_size=16)\n"
                "# or batch yourself: collect requests for <= 2 ms, torch.stack them, one forward, split"
            ),
            saving_ms=round(saving, 3),
            detail=f"Replaying the captured input, one forward of batch {probe.best_batch} costs {probe.gain:.1f}x less per item than batch 1.",
        )
    ]


def training_mode(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if not fwd.training:
        return []
    probe = ev.batch_probe
    ratio = (probe.train_ratio if probe else None) or 1.0
    forward = (probe.forward_ms if probe else None) or 0.0
    changes = fwd.training_changes_output > 0
    # only dropout and batch-norm compute differently in training mode: without them the
    # flag costs nothing, whatever a timing ratio says
    saving = max(forward * (1 - 1 / ratio), 0.0) if changes and ratio > 1 else 0.0
    sev = "high" if changes else severity(saving, ev.p50_ms)
    return [
        Finding(
            "training-mode",
            sev,
            "The model runs in training mode" + (": dropout/batch-norm change its answers" if changes else ""),
            {"forwards_in_training_mode": fwd.training, "changes_output": changes, "train_over_eval": ratio},
            fix="model.eval()   # once, after loading",
            saving_ms=round(saving, 3) or None,
            detail="In training mode dropout drops activations at random and batch-norm uses batch statistics: results vary from call to call."
            if changes
            else "No dropout or batch-norm here, so the answers are the same; eval() is still the mode to serve in.",
        )
    ]


def grad_enabled(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if not fwd.grad:
        return []
    probe = ev.batch_probe
    ratio = (probe.grad_ratio if probe else None) or 1.0
    forward = (probe.forward_ms if probe else None) or 0.0
    saving = forward * (1 - 1 / ratio) if ratio > 1 else 0.0
    sev = severity(saving, ev.p50_ms)
    return [
        Finding(
            "grad-enabled",
            sev,
            "The forward runs with autograd on",
            {"forwards_with_grad": fwd.grad, "grad_over_inference_mode": ratio},
            fix="with torch.inference_mode():\n    y = model(x)",
            saving_ms=round(saving, 3) or None,
            detail="Autograd records a graph and keeps activations alive for a backward pass that never comes."
            + (" Here it costs nothing measurable, but it holds memory." if sev == "info" else ""),
        )
    ]


_STAGE_FIX = {
    "preprocess": "# do per-request preparation in bulk: vectorise (numpy/torch ops, not Python loops),\n# cache what does not change between requests, and keep it off the event loop",
    "postprocess": "# avoid .tolist() and Python loops over big tensors; return numpy arrays\n# (orjson serialises them natively) or raw bytes",
    "serialize": (
        "# serialise with orjson and return the bytes, skipping FastAPI's jsonable_encoder:\n"
        "from fastapi import Response\n"
        "return Response(orjson.dumps({'vector': y.numpy()}, option=orjson.OPT_SERIALIZE_NUMPY),\n"
        "                media_type='application/json')"
    ),
}
_STAGE_ID = {"preprocess": "slow-preprocess", "postprocess": "slow-postprocess", "serialize": "slow-serialization"}
_STAGE_WORDS = {"preprocess": "Preprocessing", "postprocess": "Postprocessing", "serialize": "Serialization"}


def fix_for_hot_spot(stage_name: str, hot: str, user_code: bool) -> str:
    """The fix that fits what the stage's hot spot is, naming the user's line where it is theirs."""
    where = hot.split(";")[0].strip().split(" (")[0]
    if "pandas" in hot:
        return (
            f"# the hot spot is pandas ({where}): a DataFrame built per request costs far more than the model\n"
            "x = np.asarray([[row['a'], row['b'], row['c']] for row in rows], dtype=np.float32)\n"
            "y = model.predict(x)   # estimators take arrays; keep column order fixed at start-up"
        )
    if "PIL" in hot or "Image" in hot:
        return (
            f"# the hot spot is image handling ({where}): decode and resize once, then vectorise\n"
            "img = Image.open(io.BytesIO(data)).convert('RGB').resize((224, 224))\n"
            "x = (np.asarray(img, dtype=np.float32) / 255 - MEAN) / STD   # broadcasting, no per-pixel loops"
        )
    if any(k in hot for k in ("tolist", "jsonable_encoder", "json", "encoders.py", "render")):
        return _STAGE_FIX["serialize"] if stage_name == "serialize" else _STAGE_FIX["postprocess"]
    if user_code:
        return (
            f"# the hot spot is your own Python code ({where}): loops over numbers one at a time\n"
            "# vectorise with numpy: one call over the whole array instead of a Python loop\n"
            "scores = corpus_embeddings @ query            # a matmul, not zip/sum per row\n"
            "top = np.argpartition(-scores, k)[:k]         # top-k without sorting everything\n"
            "top = top[np.argsort(-scores[top])]"
        )
    return _STAGE_FIX[stage_name]


def slow_stages(ev: Evidence) -> list[Finding]:
    out = []
    for name, fid in _STAGE_ID.items():
        s = ev.stages.get(name)
        if not s or s.get("share") is None:
            continue
        share, mean = s["share"], s["mean_ms"]
        if share < 0.25 or mean < 1.0:
            continue
        evidence = {"mean_ms": mean, "p95_ms": s["p95_ms"], "share": share}
        if ev.hot_spots.get(name):
            evidence["hot_spot"] = ev.hot_spots[name]
        out.append(
            Finding(
                fid,
                "high" if share >= 0.5 else "medium",
                f"{_STAGE_WORDS[name]} takes {share * 100:.0f}% of each request",
                evidence,
                fix=fix_for_hot_spot(name, ev.hot_spots[name], ev.hot_spots_in_user_code.get(name, False))
                if ev.hot_spots.get(name)
                else _STAGE_FIX[name],
                saving_ms=round(mean * 0.8, 3),
            )
        )
    return out


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
        return []
    forward = (conc.forwards.mean_ms if conc.forwards else None) or 0.0
    busy_per_request = (loop.busy_share * 1000 / conc.throughput_rps) if loop and conc.throughput_rps else 0.0
    saving = min(max(forward if model_on_loop else 0.0, busy_per_request), ev.p50_ms or float("inf"))
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
    sev = severity(saving, ev.p50_ms)
    if loop is not None and loop.longest_busy_ms >= LOOP_STALL_HIGH_MS and sev not in ("critical", "high"):
        sev = "high"  # every other request on the loop waited that long
    return [
        Finding(
            "event-loop-blocked",
            sev,
            "Heavy synchronous work runs on the event loop: concurrent requests queue behind it",
            evidence,
            fix=(
                "# an `async def` endpoint runs on the loop: make it a plain `def` (FastAPI runs it in a\n"
                "# thread pool), or hand the heavy call off:\n"
                "@app.post('/predict')\n"
                "async def predict(payload: Payload):\n"
                "    return await asyncio.to_thread(run_model, payload)\n"
                "# a big response is encoded on the loop even for `def` endpoints: return\n"
                "# Response(orjson.dumps(...)) built inside the endpoint instead"
            ),
            saving_ms=round(saving, 3) or None,
        )
    ]


def gil_contention(ev: Evidence) -> list[Finding]:
    conc, env = ev.need("concurrent"), ev.need("environment")
    if conc.cpu_cores_busy is None or conc.gil_wait_p50_ms is None:
        raise ev.missing_error("concurrent.cpu", "CPU time and GIL waits are not visible from outside the process")
    cpus = env.cpus_available or 1
    width = min(conc.concurrency, int(cpus))
    if width < 2 or not conc.throughput_rps or not conc.sequential_rps:
        return []
    if ev.p50_ms < GIL_MIN_REQUEST_MS:
        # the doctor's own client (and, for an app, the server's HTTP work) share the process's
        # GIL: on requests this short they are a large part of what holds it
        raise MissingEvidence(
            f"requests of {ev.p50_ms:.2g} ms are too short to tell the endpoint's hold on the GIL from the "
            "doctor's own work in the same process (it is measured from 5 ms)"
        )
    scaling = conc.throughput_rps / conc.sequential_rps
    on_loop = conc.forwards.on_event_loop * 2 >= max(conc.requests, 1) if conc.forwards else False
    loop_busy = conc.loop is not None and conc.loop.busy_share >= LOOP_BUSY_SHARE
    if scaling >= GIL_SCALING * width or on_loop or loop_busy:
        return []  # it scales, or the loop is the bottleneck (event-loop-blocked says so)
    warm = ev.warm
    if warm is not None and (warm.loads_per_request >= 0.5 or warm.params_built_per_request > 0):
        return []  # the Python work is the per-request load: model-load-per-request's fix removes it
    if not (0.5 <= conc.cpu_cores_busy < GIL_CORES * width) or conc.gil_wait_p50_ms < GIL_WAIT_MS:
        return []  # the CPUs are busy (native code in parallel), idle (waiting), or the GIL is free
    unused = width - conc.cpu_cores_busy
    if conc.machine_cores_idle is not None and conc.machine_cores_idle < GIL_IDLE_SHARE * unused:
        # the cores this process left unused were not idle: other processes ran on them, and a
        # thread late for the GIL is as late when the OS has no CPU to give it
        raise MissingEvidence(
            f"the machine's CPUs were busy with other processes during the concurrent phase "
            f"({conc.machine_cores_idle:.2f} cores idle while this process used {conc.cpu_cores_busy:.2f} of "
            f"{width}), so threads waiting for the GIL cannot be told from threads waiting for a CPU"
        )
    # service time per request as served now, and if `width` callers could run at once
    saving = 1000 / conc.throughput_rps - 1000 / (conc.sequential_rps * width)
    if saving < GIL_FLOOR_MS or saving < GIL_SHARE * ev.p50_ms:
        return []
    evidence = {
        "concurrency": conc.concurrency,
        "sequential_rps": conc.sequential_rps,
        "concurrent_rps": conc.throughput_rps,
        "scaling": round(scaling, 2),
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
            severity(saving, ev.p50_ms),
            "Pure-Python work holds the GIL: concurrent requests run one at a time",
            evidence,
            fix=(
                "# the hot spot is Python code, so threads take turns on one core:\n"
                "# vectorise it (numpy/torch ops release the GIL), or run it in processes:\n"
                "pool = concurrent.futures.ProcessPoolExecutor()\n"
                "result = await loop.run_in_executor(pool, cpu_heavy_part, data)\n"
                "# or serve with several worker processes (uvicorn --workers N, gunicorn -w N)"
            ),
            saving_ms=round(saving, 3),
            detail=f"{conc.concurrency} callers got {scaling:.2f}x the throughput of one while the process used "
            f"{conc.cpu_cores_busy:.2f} of {cpus:g} CPUs, and a thread that only wanted the GIL waited "
            f"{conc.gil_wait_p50_ms:.1f} ms for it (p50). The saving is server time per request if "
            f"{width} requests could run at once.",
        )
    ]


def thread_oversubscription(ev: Evidence) -> list[Finding]:
    env = ev.need("environment")
    cpus = env.cpus_available
    pools = {"torch_threads": env.torch_threads, "blas_threads": env.blas_threads, "onnxruntime_threads": env.ort_threads}
    pools = {k: v for k, v in pools.items() if v}
    if not pools or not cpus:
        return []
    worst, threads = max(pools.items(), key=lambda kv: kv[1])
    used = threads * env.workers
    if used <= cpus:
        return []
    share = max(1, int(cpus) // max(1, env.workers))
    fixes = {
        "torch_threads": f"torch.set_num_threads({share})   # CPUs / workers, at start-up",
        "blas_threads": f"threadpoolctl.threadpool_limits({share})   # numpy/scikit-learn's BLAS and OpenMP pools\n# or OMP_NUM_THREADS={share} OPENBLAS_NUM_THREADS={share} in the environment",
        "onnxruntime_threads": f"opts = onnxruntime.SessionOptions()\nopts.intra_op_num_threads = {share}\nsession = onnxruntime.InferenceSession(path, opts)",
    }
    return [
        Finding(
            "thread-oversubscription",
            "high" if used >= 2 * cpus else "medium",
            "More compute threads than CPUs: they spin and contend",
            {**pools, "workers": env.workers, "cpus_available": cpus},
            fix=fixes[worst] + ("\n# or OMP_NUM_THREADS in the environment" if worst == "torch_threads" else ""),
        )
    ]


def repeated_work(ev: Evidence) -> list[Finding]:
    ev.need_probes(*MODEL_CALLS)
    r = ev.need("repeated")
    if r.calls_per_request < 1 or r.ms_per_request < REPEATED_SHARE * ev.p50_ms:
        return []
    return [
        Finding(
            "repeated-work",
            severity(r.ms_per_request, ev.p50_ms),
            "The same model call on the same inputs runs on every request",
            {
                "calls_per_request": r.calls_per_request,
                "ms_per_request": r.ms_per_request,
                "modules": ", ".join(r.modules),
                "batch_sizes": r.batch_sizes,
            },
            fix=(
                "# its inputs do not depend on the request: compute it once, at start-up\n"
                "CORPUS_EMBEDDINGS = embed(CORPUS)          # at import, or in the app's lifespan\n\n"
                "def search(q):\n"
                "    query = embed([q.text])                # only what the request changes\n"
                "    scores = CORPUS_EMBEDDINGS @ query.T\n"
                "# or cache by input: functools.lru_cache on a function of hashable arguments"
            ),
            saving_ms=round(r.ms_per_request, 3),
            detail="Its inputs (shape, dtype and a sample of the values) were the same in every request, "
            "including one sent with the payload's texts and numbers changed.",
        )
    ]


def padding_waste(ev: Evidence) -> list[Finding]:
    ev.need_probes("torch module hooks")
    fwd = ev.need("warm").forwards
    if fwd.pad_share is None or fwd.pad_share < PADDING_SHARE:
        return []
    saving = fwd.padding_ms_per_request or 0.0
    return [
        Finding(
            "padding-waste",
            severity(saving, ev.p50_ms),
            f"{fwd.pad_share * 100:.0f}% of the model's input is padding",
            {"pad_share": fwd.pad_share, "padding_ms_per_request": fwd.padding_ms_per_request},
            fix=(
                "# pad to the longest text in the batch, not to a fixed length\n"
                "inputs = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors='pt')\n"
                "# (padding='max_length' pads every short text to max_length tokens)"
            ),
            saving_ms=round(saving, 3),
            detail="The attention mask is mostly zeros: the model computes over padding tokens and throws the result away. "
            "The saving assumes the cost is linear in the length (attention grows faster).",
        )
    ]
