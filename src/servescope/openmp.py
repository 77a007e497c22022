"""How torch's idle OpenMP threads wait for the next parallel region: ``servescope serve`` makes
them sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose; the doctor names the policy
in its fix for threads that contend with a neighbour.

GNU OpenMP's default is to spin (busy-wait) for a while before it sleeps. On a quiet machine
that saves a wake-up; beside another process that keeps a core busy (a neighbour container, a
sidecar, a batch job) it is ruinous: a thread spinning at a barrier takes the CPU its partner
needs to reach it. Measured on a 2-core machine with a neighbour in another scheduling group
(docs/benchmarks.md): an image model built and run per request took 1,100 ms a request with
the default and 99 ms with PASSIVE; on the quiet machine 104 ms and 93 ms. A small decoder
(about 1 ms a step) served beside the neighbour: 2.9 requests/s at c=8 with the default, 55-87
with PASSIVE; its price is on a quiet machine, where waking the threads for each small region
cost it a third (52-55 against 71-97 requests/s): a server with its cores to itself can set
``OMP_WAIT_POLICY=ACTIVE``, which is kept.

OpenMP reads the policy once, when its library loads (with torch), so it is set before the
user's file is imported. Where torch was loaded first (``serve()`` called in a file that
imported torch), it is too late: the start-up line and ``/info`` say so, with the variable to
set in the server's environment.

    wait = prefer_passive_wait()     # before the user's code is imported
    wait.policy, wait.source         # ("PASSIVE", "servescope"), or the user's, or the default
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["KNOBS", "Wait", "openmp_loaded", "prefer_passive_wait", "wait_policy_set"]

#: The variables that set how OpenMP threads wait (GNU's and Intel's runtimes): any one set by
#: the user is theirs, and kept.
KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: Marks the policy as servescope's own choice in the processes it starts (its workers).
_OURS = "SERVESCOPE_OMP_WAIT_POLICY"
_RUNTIMES = ("libgomp", "libiomp", "libomp")


@dataclass(frozen=True)
class Wait:
    policy: str  # "PASSIVE", "OMP_WAIT_POLICY=ACTIVE", "spin, then sleep (OpenMP's default)"
    source: str  # "servescope", "yours", "too late", "no OpenMP"
    words: str  # the start-up line's phrase

    def as_info(self) -> dict[str, str]:
        return {"omp_wait_policy": self.policy, "omp_wait_from": self.source}


def openmp_loaded(maps: str = "/proc/self/maps") -> bool | None:
    """Whether an OpenMP runtime is loaded in this process (None: cannot tell)."""
    try:
        with open(maps) as f:
            return any(name in line for line in f for name in _RUNTIMES)
    except OSError:
        return None


def wait_policy_set(environ: os._Environ[str] | dict[str, str] = os.environ) -> str:
    """The policy the user set (``"OMP_WAIT_POLICY=ACTIVE"``), or "" for OpenMP's default."""
    return ", ".join(f"{k}={environ[k]}" for k in KNOBS if environ.get(k, "").strip())


def prefer_passive_wait(environ: os._Environ[str] | dict[str, str] = os.environ, loaded: bool | None = None) -> Wait:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` when the user set none of ``KNOBS`` and no OpenMP runtime
    is loaded yet; say what the policy is and who chose it."""
    if environ.get(_OURS) and environ.get("OMP_WAIT_POLICY") == "PASSIVE":
        return _ours()
    mine = wait_policy_set(environ)
    if mine:
        return Wait(mine, "yours", f"as you set ({mine})")
    if loaded is None:
        loaded = openmp_loaded()
    if loaded:
        return Wait(
            "spin, then sleep (OpenMP's default)",
            "too late",
            "spinning first (OpenMP's default: torch was loaded before servescope could choose; beside a busy "
            "neighbour set OMP_WAIT_POLICY=PASSIVE in the server's environment)",
        )
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    environ[_OURS] = "1"
    return _ours()


def _ours() -> Wait:
    return Wait("PASSIVE", "servescope", "asleep when idle (OMP_WAIT_POLICY=PASSIVE: a busy neighbour's core does not stall them)")
