"""Memory the kernel maps and zeroes afresh on every request (doctor/fresh.py measures the fix).

glibc's malloc gives a large freed buffer back to the kernel (a fresh mapping above its mmap
threshold; the top of its heap above its trim threshold), and the next request's buffer is
mapped and zeroed again: a page fault per 4 KiB. A MiniLM router at 6 x 256 tokens took 50-60k
faults a request under uvicorn: 245 ms as written, 187 ms with glibc told to keep them
(docs/benchmarks.md). The thresholds are read when the process starts, so the doctor tries them
in fresh processes of the endpoint and names the cause only when it measured it.
"""

from __future__ import annotations

from ..allocator import keep_freed_words
from ..doctor.evidence import Evidence
from ..doctor.fresh import churn_called_for
from ..report import Finding
from .savings import fresh_gain, measured_or_estimated

__all__ = ["memory_churn"]

#: the fix must save this share of the as-written process's p50, its interval above zero at 90%
#: or more, and the faults must be what it removed (the fixed process faulting at most
#: ``FAULTS_LEFT`` of the as-written one's a request): two processes of one endpoint can differ
#: by a few percent by their history alone
CHURN_SAVING_SHARE, FAULTS_LEFT = 0.05, 0.5
#: its load: one caller, in a fresh process (its own budget: not the doctor's process's p50)
LOAD = "c=1, fresh process"
PAGE_KB = 4

FIX = (
    "# glibc's malloc keeps large freed buffers for the next request instead of handing them back to\n"
    "# the kernel (set in the server's environment, before it starts; ENV lines in a Dockerfile):\n"
    + keep_freed_words() + " uvicorn app:app ...\n"
    "# (or preload jemalloc or tcmalloc: LD_PRELOAD=libjemalloc.so.2; not measured here)"
)


def memory_churn(ev: Evidence) -> list[Finding]:
    if not churn_called_for(ev):
        return []
    w = fresh_gain(
        ev, "keep-freed-memory", CHURN_SAVING_SHARE, cause="the requests fault fresh memory in; keeping freed memory not tried",
        untried="glibc's malloc reads its thresholds when the process starts, so trying them needs fresh processes of the endpoint: "
        "run servescope doctor FILE:app",
    )  # fmt: skip
    if w is None:
        return []
    base, faults, left = w.base_p50_ms or 0.0, w.base_faults_per_request or 0.0, w.fixed_faults_per_request
    if left is None or faults <= 0 or left > FAULTS_LEFT * faults:
        return []  # (faster, but not by faulting less: not this cause)
    saving = measured_or_estimated(ev, "keep-freed-memory", estimate_ms=None, estimated_from="", p50_ms=base)
    saving.load = LOAD
    evidence = {
        "minor_faults_per_request": faults, "faults_with_the_fix": left, "mb_mapped_per_request": round(faults * PAGE_KB / 1024, 1),
        "doctor_faults_per_request": ev.warm.minor_faults_per_request if ev.warm is not None else None,
        "fresh_p50_ms": w.base_p50_ms, "fresh_fixed_p50_ms": w.fixed_p50_ms,
    }  # fmt: skip
    detail = (
        f"In a fresh process as written each request took {faults:,.0f} minor page faults (about {faults * PAGE_KB / 1024:,.0f} MB "
        f"mapped and zeroed), {left:,.0f} with the fix. "
        "How many pages a request faults as written depends on the process's heap (what it imported and allocated "
        "before): the same endpoint can fault several times more or fewer in another process (your server's imports "
        "are not the doctor's), so your server may save more or less than here; the fix removes them either way. "
    )
    if w.extra_mb is not None:
        evidence["extra_mb"] = w.extra_mb
        detail += f"The price: the process keeps its freed memory ({w.extra_mb:+.0f} MB resident against the process as written). "
    return [
        Finding(
            "memory-churn",
            saving.severity(),
            "Every request maps fresh memory from the kernel: glibc's malloc hands large freed buffers back",
            evidence,
            fix=FIX,
            saving_ms=saving.ms,
            detail=detail + saving.detail,
            **saving.fields(),
        )
    ]
