"""thread-oversubscription: more compute threads (torch, ONNX Runtime, BLAS) than the CPUs
the endpoint really has, in-process (the pools counted, fewer threads tried) and from outside
(doctor --pid: /proc's busy and waiting threads)."""

from __future__ import annotations

from ..doctor.evidence import Environment, Evidence, WhatIf
from ..doctor.experiments.lab import INTERVAL_COVERAGE
from ..report import Finding
from .causes import GIL_CORES
from .savings import BUSY_CORES, measured_or_estimated

__all__ = ["thread_oversubscription"]


#: fewer threads must save this share of the p50, measured, for a pool to be named a misfit
CONTENTION_SHARE = 0.05

_THREAD_EXPERIMENT = {"torch_threads": "torch-threads", "onnxruntime_threads": "ort-threads", "blas_threads": "blas-threads"}


def _fewer_threads_won(ev: Evidence, experiment: str) -> WhatIf | None:
    """The experiment, when fewer threads won measurably: the low end of an interval of at
    least 90% above zero, and a saving of ``CONTENTION_SHARE`` of the p50."""
    w = ev.tried(experiment)
    if w is None or (w.low_ms or 0.0) <= 0 or (w.coverage is not None and w.coverage < INTERVAL_COVERAGE):
        return None
    return w if (w.saving_ms or 0.0) >= CONTENTION_SHARE * (w.base_p50_ms or 0.0) else None


#: doctor --pid: the process's threads waited this many cores' worth for a CPU
THREAD_WAIT_CORES = 0.25


def _threads_from_outside(ev: Evidence) -> list[Finding]:
    """thread-oversubscription as /proc shows a live process (doctor --pid): more of its threads
    busy than CPUs, and they waited for one. Which pool to shrink is not known from outside."""
    conc = ev.need("concurrent")
    busy, waiting = conc.threads_busy, conc.cpu_wait_cores
    cpus = ev.machine.cpus_available if ev.machine is not None else None
    if busy is None or waiting is None or not cpus:
        raise ev.missing_error("environment", "the process's threads are not visible from outside")
    others = ev.machine.others_cores if ev.machine is not None and ev.machine.others_cores is not None else 0.0
    free = cpus - others if others >= BUSY_CORES else cpus
    if busy <= cpus or waiting < THREAD_WAIT_CORES or (conc.cpu_cores_busy or 0.0) < GIL_CORES * free:
        return []  # (threads that take turns on the GIL are many and busy, but leave the CPUs free)
    share = max(1, int(free + 0.5) // max(conc.processes or 1, 1))
    evidence = {"threads_busy": busy, "cpus_available": cpus, "cpu_wait_cores": waiting, "processes": conc.processes, "cpu_cores_busy": conc.cpu_cores_busy}
    if others >= BUSY_CORES:
        evidence["others_cores"] = round(others, 2)
    return [
        Finding(
            "thread-oversubscription",
            "high" if waiting >= 1.0 else "medium",
            "More busy threads than CPUs: they wait for each other",
            evidence,
            fix=(f"# each worker process's compute pools sized to the CPUs it has, at start-up (here {share}):\n"
                 f"torch.set_num_threads({share})\n# or OMP_NUM_THREADS={share} MKL_NUM_THREADS={share} in the server's environment;\n"
                 "# an ONNX Runtime session: SessionOptions.intra_op_num_threads"),  # fmt: skip
            detail=(
                f"Measured from outside (/proc): {busy} of the process's threads used a tenth of a core or more on "
                f"{cpus:g} CPUs, and they waited {waiting:.2f} cores' worth for one. Which pool they belong to (torch, ONNX "
                "Runtime, BLAS) cannot be seen from outside; the saving is not measured: set the threads and compare with "
                "servescope bench."
            ),
        )
    ]


def _torch_env_fix(env: Environment, contended: bool, passive: WhatIf | None) -> str:
    """The environment's way to the same fix; beside a neighbour, with OpenMP's default wait
    (its idle threads spin before they sleep), the policy that keeps the threads for when the
    neighbour leaves: the spinning is what stalls each parallel region (docs/benchmarks.md:
    1,100 -> 99 ms a request, and no cost on the quiet machine)."""
    text = "\n# or OMP_NUM_THREADS in the environment"
    if contended and env.omp_wait_policy == "default":
        text += (
            "\n# or keep the threads for when the neighbour leaves, and let idle ones sleep instead of spinning:"
            "\n# OMP_WAIT_POLICY=PASSIVE in the server's environment (read when torch loads: "
            + (f"tried in fresh processes of the endpoint: p50 {passive.base_p50_ms:.4g} -> {passive.fixed_p50_ms:.4g} ms)"
               if passive is not None else "not tried by the doctor)")
        )  # fmt: skip
    return text


def thread_oversubscription(ev: Evidence) -> list[Finding]:
    if ev.target_kind == "pid":
        return _threads_from_outside(ev)
    env = ev.need("environment")
    cpus = env.cpus_available
    pools = {"torch_threads": env.torch_threads, "blas_threads": env.blas_threads, "onnxruntime_threads": env.ort_threads}
    pools = {k: v for k, v in pools.items() if v}
    if not pools or not cpus:
        return []
    # the pool named: the one fewer threads measurably beat the most, else the largest
    won = {k: w for k in pools if (w := _fewer_threads_won(ev, _THREAD_EXPERIMENT[k])) is not None}
    worst = max(won, key=lambda k: won[k].saving_ms or 0.0) if won else max(pools, key=lambda k: pools[k])
    experiment, used = _THREAD_EXPERIMENT[worst], pools[worst] * env.workers
    # the CPUs really free: what other processes kept busy during the warm requests is not
    # this endpoint's to spin on (a neighbour, a sidecar, a batch job on the node)
    others = ev.machine.others_cores if ev.machine is not None and ev.machine.others_cores is not None else 0.0
    free = cpus - others
    contended = others >= BUSY_CORES and used > free + 0.5
    if used <= cpus and not contended:
        return []
    if used <= cpus and worst not in won:
        # a neighbour comes and goes: only a pool that fewer threads measurably beat on this
        # machine, now, is a misfit worth naming (a timing, not a count, so it must be measured)
        return []
    share = max(1, min(int(cpus) // max(1, env.workers), int(free + 0.5)))
    fixes = {
        "torch_threads": f"torch.set_num_threads({share})   # the CPUs free / workers, at start-up",
        "blas_threads": f"threadpoolctl.threadpool_limits({share})   # numpy/scikit-learn's BLAS and OpenMP pools\n# or OMP_NUM_THREADS={share} OPENBLAS_NUM_THREADS={share} in the environment",
        "onnxruntime_threads": f"opts = onnxruntime.SessionOptions()\nopts.intra_op_num_threads = {share}\nsession = onnxruntime.InferenceSession(path, opts)",
    }
    saving = measured_or_estimated(ev, experiment, estimate_ms=None, estimated_from="")
    evidence = {**pools, "workers": env.workers, "cpus_available": cpus}
    if others >= BUSY_CORES:
        evidence.update(others_cores=round(others, 2), cpus_free=round(free, 2))
    sev = "high" if used >= 2 * cpus else "medium"
    if saving is not None and saving.ms is not None:
        sev = saving.severity()
    title = (
        "More compute threads than CPUs: they spin and contend"
        if used > cpus
        else f"More compute threads than the CPUs left free by other processes ({free:.1f} of {cpus:g}): they wait for each other"
    )
    return [
        Finding(
            "thread-oversubscription",
            sev,
            title,
            evidence,
            fix=fixes[worst] + (_torch_env_fix(env, contended, ev.tried("omp-passive")) if worst == "torch_threads" else ""),
            saving_ms=saving.ms if saving is not None and saving.ms else None,
            detail=saving.detail if saving is not None else "",
            **(saving.fields() if saving is not None and saving.ms else {}),
        )
    ]
