"""OpenMP's idle threads spinning on the cores a neighbour needs (doctor/fresh.py measures it).

GNU OpenMP's threads spin a while at each barrier before they sleep (its default wait policy).
Beside another busy process a spinning thread holds the core its partner needs, and each
parallel region of the model can stall for a scheduler tick: one endpoint served by uvicorn
beside one busy core took 1,100 ms a request as written and 99 ms with
``OMP_WAIT_POLICY=PASSIVE`` (docs/benchmarks.md). The policy is read when torch loads, so the
doctor tries it in fresh processes of the endpoint and names the cause only when it measured it.
"""

from __future__ import annotations

from ..doctor.evidence import Evidence
from ..doctor.fresh import passive_called_for
from ..report import Finding
from .savings import fresh_gain, measured_or_estimated

__all__ = ["openmp_spin_wait"]

#: the fix must save this share of the as-written process's p50, its interval above zero at
#: 90% or more, to be named. Each arm is one process, and two processes of the same endpoint can
#: differ by their threads' history alone (a few tens of percent on a busy machine: the blocks'
#: interval cannot see that), so only a larger gain is the policy's; spinning beside a
#: neighbour costs several-fold (docs/benchmarks.md)
SPIN_SHARE = 0.25
#: the load its saving holds at: one caller, in a fresh process (not the doctor's own, whose
#: threads' history differs: the saving does not share the in-process p50's budget)
LOAD = "c=1, fresh process"

FIX = (
    "OMP_WAIT_POLICY=PASSIVE   # in the server's environment, set before torch loads:\n"
    "# ENV OMP_WAIT_POLICY=PASSIVE in the Dockerfile, or OMP_WAIT_POLICY=PASSIVE uvicorn app:app ...\n"
    "# (servescope serve sets it unless you set it yourself)"
)


def openmp_spin_wait(ev: Evidence) -> list[Finding]:
    if not passive_called_for(ev):
        return []
    w = fresh_gain(
        ev, "omp-passive", SPIN_SHARE, cause="torch's OpenMP threads may spin beside the neighbour; OMP_WAIT_POLICY=PASSIVE not tried",
        untried="OMP_WAIT_POLICY is read when torch loads, so trying it needs fresh processes of the endpoint: run servescope doctor FILE:app",
    )  # fmt: skip
    if w is None:
        return []
    base = w.base_p50_ms or 0.0
    saving = measured_or_estimated(ev, "omp-passive", estimate_ms=None, estimated_from="", p50_ms=base)
    saving.load = LOAD
    env = ev.environment
    evidence = {
        "omp_wait_policy": "default", "torch_threads": env.torch_threads if env is not None else None,
        "others_cores": w.others_cores, "fresh_p50_ms": w.base_p50_ms, "fresh_passive_p50_ms": w.fixed_p50_ms,
        "doctor_p50_ms": ev.p50_ms,
    }  # fmt: skip
    detail = saving.detail  # (the fix's words say where it was tried: fresh processes)
    if ev.p50_ms and base and max(base / ev.p50_ms, ev.p50_ms / base) >= 2:
        detail += (
            f" The doctor's own process ran the endpoint at p50 {ev.p50_ms:.4g} ms: with the threads spinning, a process's "
            "speed beside a neighbour depends on its threads' history, so the other milliseconds in this report may be "
            "several-fold off your server's. Set OMP_WAIT_POLICY=PASSIVE and run the doctor again for figures to bank on."
        )
    return [
        Finding(
            "openmp-spin-wait",
            saving.severity(),
            "torch's idle OpenMP threads spin on the cores another process needs: each parallel step can stall",
            evidence,
            fix=FIX,
            saving_ms=saving.ms,
            detail=detail,
            **saving.fields(),
        )
    ]
