"""One function per cause. Each reads the evidence, decides, sizes, and writes the fix."""

from __future__ import annotations

from typing import Any

from ..report import Finding, Report


#: Thresholds (docs/doctor.md).
NO_BATCHING_FLOOR_MS = 0.2
COLD_RATIO, COLD_EXTRA_MS = 3.0, 50.0
LOOP_LAG_ALONE_MS = 100.0


def _ev(report: Report) -> dict[str, Any]:
    return report.extra["evidence"]


def _p50(report: Report) -> float:
    return float(report.latency.get("p50_ms") or _ev(report)["warm"]["p50_ms"] or 0.0)


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


def model_load_per_request(report: Report) -> list[Finding]:
    warm = _ev(report)["warm"]
    loads, built = warm["loads_per_request"], warm["constructed_per_request"]
    if loads < 0.5 and built < 1:
        return []
    saving = warm["load_ms_per_request"] + warm["construct_ms_per_request"]
    what = ", ".join(warm["load_calls"]) or "nn.Module construction"
    return [
        Finding(
            "model-load-per-request",
            severity(saving, _p50(report)),
            "The model is loaded again on every request",
            {
                "loads_per_request": loads,
                "modules_built_per_request": built,
                "load_calls": what,
                "load_ms_per_request": round(saving, 3),
                "p50_ms": _p50(report),
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


def cold_start(report: Report) -> list[Finding]:
    ev = _ev(report)
    cold, p50 = ev["cold"]["latency_ms"], _p50(report)
    warm = ev["warm"]
    lazy = (ev["cold"]["loads"] > 0 or ev["cold"]["constructed"] > 0) and (
        warm["loads_per_request"] < 0.5 and warm["constructed_per_request"] < 1
    )
    if ev["cold"].get("error") or not p50 or cold < COLD_RATIO * p50 or cold - p50 < COLD_EXTRA_MS:
        return []
    extra = cold - p50
    sev = "high" if cold >= 10 * p50 and extra >= 200 else "medium"
    return [
        Finding(
            "cold-start",
            sev,
            "The first request is far slower than the rest: no warm-up",
            {
                "first_ms": round(cold, 2),
                "p50_ms": p50,
                "ratio": round(cold / p50, 1),
                "loaded_on_first_request": lazy,
                "first_request_load_calls": ", ".join(label for label, _ in ev["cold"]["load_calls"]) or "-",
            },
            fix=(
                "# load and run one example at start-up, before the server reports ready\n"
                "model = load_model()\n"
                "with torch.inference_mode():\n"
                "    model(example_input)      # also each batch size you will use\n"
                "# servescope.serve(Model(), example=...) does both before /ready"
            ),
            saving_ms=round(extra, 2),
            detail="Only the first request pays this; " + ("the model is loaded lazily by it." if lazy else "first-call initialisation (allocation, tracing, kernels) runs in it."),
        )
    ]


def model_not_on_accelerator(report: Report) -> list[Finding]:
    ev = _ev(report)
    if not ev["environment"]["cuda_available"]:
        return []
    fwd = ev["warm"]["forwards"]
    if not fwd["count"] or any(d.startswith("cuda") for d in fwd["param_devices"]):
        return []
    probe = ev.get("batch_probe") or {}
    return [
        Finding(
            "model-not-on-accelerator",
            "high",
            "A GPU is available but the model runs on the CPU",
            {"param_devices": ", ".join(fwd["param_devices"]), "forward_ms": probe.get("forward_ms")},
            fix="device = torch.device('cuda')\nmodel = model.to(device).eval()   # once, at start-up\nx = x.to(device, non_blocking=True)",
            saving_ms=None,
        )
    ]


def repeated_transfer(report: Report) -> list[Finding]:
    warm = _ev(report)["warm"]
    copies = warm["h2d_per_request"] + warm["d2h_per_request"]
    problems = {}
    if warm["module_moves_per_request"] >= 1:
        problems["model_moved_per_request"] = warm["module_moves_per_request"]
    if warm["small_copies_per_request"] >= 4:
        problems["small_copies_per_request"] = warm["small_copies_per_request"]
    if warm["unpinned_async_per_request"] >= 1:
        problems["non_blocking_from_unpinned"] = warm["unpinned_async_per_request"]
    if warm["syncs_per_request"] >= 4:
        problems["sync_points_per_request"] = warm["syncs_per_request"]
    if copies > 4:
        problems["copies_per_request"] = copies
    if not problems:
        return []
    stages = report.stages
    saving = sum((stages.get(s) or {}).get("mean_ms") or 0.0 for s in ("to_device", "to_host"))
    return [
        Finding(
            "repeated-transfer",
            severity(saving, _p50(report)),
            "Host<->device copies are done piecemeal or synchronously",
            {**problems, "copy_bytes_per_request": warm["copy_bytes_per_request"], "transfer_ms": round(saving, 3)},
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


def no_batching(report: Report) -> list[Finding]:
    ev = _ev(report)
    conc, probe = ev["concurrent"], ev.get("batch_probe") or {}
    fwd = conc["forwards"]
    # most requests ran a forward of their own (a runtime that batches on a worker and runs
    # only the odd lone request in the request's own context shows few forwards here)
    own = fwd["count"] * 2 >= max(conc.get("requests") or 0, 1)
    if conc["concurrency"] < 2 or not own or fwd["max_batch"] > 1 or not probe.get("gain"):
        return []
    gain = probe["gain"]
    one = probe["per_item_ms"].get("1")
    if gain < 1.3 or one is None:
        return []
    saving = one * (1 - 1 / gain)
    p50 = _p50(report)
    if saving < 0.05 * p50 or saving < NO_BATCHING_FLOOR_MS:
        return []  # batching would not move this endpoint's latency: not its problem
    return [
        Finding(
            "no-batching",
            severity(saving, p50),
            "Concurrent requests each run their own batch-of-one forward",
            {
                "concurrency": conc["concurrency"],
                "forward_batch_sizes": fwd["batch_sizes"],
                "per_item_ms_at_batch_1": one,
                "best_batch": probe["best_batch"],
                "per_item_gain": gain,
            },
            fix=(
                "# let concurrent requests share one forward\n"
                "app = servescope.serve(MyModel(), max_batch_size=16)\n"
                "# or batch yourself: collect requests for <= 2 ms, torch.stack them, one forward, split"
            ),
            saving_ms=round(saving, 3),
            detail=f"Replaying the captured input, one forward of batch {probe['best_batch']} costs {gain:.1f}x less per item than batch 1.",
        )
    ]


def training_mode(report: Report) -> list[Finding]:
    ev = _ev(report)
    fwd = ev["warm"]["forwards"]
    if not fwd["training"]:
        return []
    probe = ev.get("batch_probe") or {}
    ratio = probe.get("train_ratio") or 1.0
    forward = probe.get("forward_ms") or 0.0
    saving = max(forward * (1 - 1 / ratio), 0.0) if ratio > 1 else 0.0
    changes = fwd["training_changes_output"] > 0
    if not changes and ratio < 1.10:
        return []  # a flag set on a wrapper whose modules behave the same: no effect to report
    sev = "high" if changes else severity(saving, _p50(report))
    return [
        Finding(
            "training-mode",
            sev,
            "The model runs in training mode" + (": dropout/batch-norm change its answers" if changes else ""),
            {"forwards_in_training_mode": fwd["training"], "changes_output": changes, "train_over_eval": ratio},
            fix="model.eval()   # once, after loading",
            saving_ms=round(saving, 3) or None,
            detail="In training mode dropout drops activations at random and batch-norm uses batch statistics: results vary from call to call.",
        )
    ]


def grad_enabled(report: Report) -> list[Finding]:
    ev = _ev(report)
    fwd = ev["warm"]["forwards"]
    if not fwd["grad"]:
        return []
    probe = ev.get("batch_probe") or {}
    ratio = probe.get("grad_ratio") or 1.0
    forward = probe.get("forward_ms") or 0.0
    saving = forward * (1 - 1 / ratio) if ratio > 1 else 0.0
    sev = severity(saving, _p50(report))
    return [
        Finding(
            "grad-enabled",
            sev,
            "The forward runs with autograd on",
            {"forwards_with_grad": fwd["grad"], "grad_over_inference_mode": ratio},
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


def slow_stages(report: Report) -> list[Finding]:
    out = []
    hot = (_ev(report).get("hot_spots") or {})
    for name, fid in _STAGE_ID.items():
        s = report.stages.get(name)
        if not s or s.get("share") is None:
            continue
        share, mean = s["share"], s["mean_ms"]
        if share < 0.25 or mean < 1.0:
            continue
        evidence = {"mean_ms": mean, "p95_ms": s["p95_ms"], "share": share}
        if hot.get(name):
            evidence["hot_spot"] = hot[name]
        out.append(
            Finding(
                fid,
                "high" if share >= 0.5 else "medium",
                f"{_STAGE_WORDS[name]} takes {share * 100:.0f}% of each request",
                evidence,
                fix=_STAGE_FIX[name],
                saving_ms=round(mean * 0.8, 3),
            )
        )
    return out


def event_loop_blocked(report: Report) -> list[Finding]:
    ev = _ev(report)
    conc = ev["concurrent"]
    on_loop = conc["forwards"]["on_event_loop"]
    lag = conc.get("loop_lag_max_ms") or 0.0
    # under concurrency most requests' forwards ran on the loop (a runtime that runs only a
    # lone request there, when nothing else waits, is not blocking anyone); the lag monitor
    # shares the GIL with the doctor's own threads, so lag alone must be large
    usual = on_loop * 2 >= max(conc.get("requests") or 0, 1)
    if not (usual and lag >= 2) and lag < LOOP_LAG_ALONE_MS:
        return []
    forward = conc["forwards"].get("mean_ms") or 0.0
    return [
        Finding(
            "event-loop-blocked",
            "high" if lag >= 50 else "medium",
            "Heavy synchronous work runs on the event loop: concurrent requests queue behind it",
            {
                "loop_blocked_max_ms": lag,
                "loop_blocked_p99_ms": conc.get("loop_lag_p99_ms"),
                "forwards_on_the_loop": on_loop,
                "sequential_rps": conc.get("sequential_rps"),
                "concurrent_rps": conc.get("throughput_rps"),
            },
            fix=(
                "# a plain `def` endpoint runs in FastAPI's thread pool; or hand the work off:\n"
                "@app.post('/predict')\n"
                "async def predict(payload: Payload):\n"
                "    return await asyncio.to_thread(run_model, payload)"
            ),
            saving_ms=round(forward, 3) or None,
        )
    ]


def thread_oversubscription(report: Report) -> list[Finding]:
    env = _ev(report)["environment"]
    threads, cpus = env.get("torch_threads"), env.get("cpus_available")
    if not threads or not cpus:
        return []
    used = threads * env.get("workers", 1)
    if used <= cpus:
        return []
    return [
        Finding(
            "thread-oversubscription",
            "high" if used >= 2 * cpus else "medium",
            "More compute threads than CPUs: they spin and contend",
            {"torch_threads": threads, "workers": env.get("workers", 1), "cpus_available": cpus},
            fix=f"torch.set_num_threads({max(1, int(cpus) // max(1, env.get('workers', 1)))})   # CPUs / workers, at start-up\n# or OMP_NUM_THREADS in the environment",
        )
    ]
