"""What a run ran on: Python, CPUs really available, torch and its device, threads."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

__all__ = [
    "HELPERS", "CpuReading", "available_cpus", "capture_environment", "cpu_pressure_us", "helper_cpu_seconds", "idle_cpu_seconds",
    "retire_helper",
]

#: pids of the processes servescope started to do its own measuring (the doctor's load
#: helper): their CPU is the measurer's, never taken for a neighbour's
HELPERS: set[int] = set()


_retired_cpu = [0.0]  # what the helpers that ended had used (the total never goes back)


def _cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, ValueError, IndexError):
        return 0.0


def helper_cpu_seconds() -> float:
    """The CPU seconds the ``HELPERS`` have used, those that ended included (Linux ``/proc``;
    0 elsewhere)."""
    return _retired_cpu[0] + sum(_cpu_of(pid) for pid in list(HELPERS))


def retire_helper(pid: int) -> None:
    """A helper about to end: what it used is kept in the total, and it is read no more."""
    if pid in HELPERS:
        _retired_cpu[0] += _cpu_of(pid)
        HELPERS.discard(pid)


def _cgroup_cpus() -> float | None:
    """The CPU quota of this process's cgroup (v2 ``cpu.max``, or v1), or None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def available_cpus() -> float:
    """CPUs this process may really use: affinity mask and cgroup quota, whichever is lower."""
    try:
        cpus: float = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpus()
    return min(cpus, quota) if quota else cpus


def idle_cpu_seconds() -> float | None:
    """Seconds the CPUs this process may use have spent idle since boot (Linux ``/proc/stat``);
    None elsewhere, or under a cgroup quota, where idle host CPUs are not ours to use.

    Two readings around a phase tell whether the machine had spare CPU while the process did
    not use it (its threads waited on each other), or was busy with other processes."""
    try:
        mine = os.sched_getaffinity(0)
        quota = _cgroup_cpus()
        if quota is not None and quota < len(mine):
            return None
        ticks = 0
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
                    ticks += int(fields[3]) + int(fields[4])  # idle + iowait
        return ticks / os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError, IndexError):
        return None


def cpu_pressure_us(path: str = "/proc/pressure/cpu") -> float | None:
    """Microseconds since boot during which some runnable task waited for a CPU (Linux's
    pressure stall information, "some total"); None where the kernel does not keep it.

    Two readings around a phase, divided by its length, give the share of the phase in which
    the CPUs were contended: near 0 on a quiet machine, large with a busy neighbour."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some "):
                    for part in line.split():
                        if part.startswith("total="):
                            return float(part[6:])
    except (OSError, ValueError):
        return None
    return None


def minor_faults() -> int:
    """This process's minor page faults so far (all its threads); 0 where the OS does not say."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def resident_mb(statm: str = "/proc/self/statm") -> float | None:
    """This process's resident memory now, in MB; None where the OS does not say."""
    try:
        with open(statm) as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 1e6, 1)


def _own_cpu() -> float:
    import time

    return time.process_time() + helper_cpu_seconds()


class CpuReading:
    """The CPUs around a phase: take one before, call ``since()`` after.

        before = CpuReading()
        ...                                  # the phase
        idle, others, pressure = before.since()

    ``idle``: cores left idle; ``others``: cores other processes used (the CPUs' busy time less
    this process's own CPU time and its helpers'); ``pressure``: share of the phase during which some runnable
    task waited for a CPU. Each is None where the OS does not say, and idle and others for a
    phase shorter than ``MIN_S`` (the kernel counts CPU time in ticks of 10 ms)."""

    MIN_S = 0.5

    def __init__(self) -> None:
        import time

        self._clock = time.perf_counter
        self.t0, self.idle0, self.psi0, self.cpu0 = self._clock(), idle_cpu_seconds(), cpu_pressure_us(), _own_cpu()

    def readable_in(self) -> float:
        """Seconds until the phase is long enough for ``since()`` to say idle and others (0: now)."""
        return max(self.MIN_S - (self._clock() - self.t0), 0.0)

    def since(self) -> tuple[float | None, float | None, float | None]:
        wall = self._clock() - self.t0
        idle1, psi1, cpu1 = idle_cpu_seconds(), cpu_pressure_us(), _own_cpu()
        if wall <= 0:
            return None, None, None
        idle = (idle1 - self.idle0) / wall if idle1 is not None and self.idle0 is not None and wall >= self.MIN_S else None
        others = None
        if idle is not None:
            others = max(available_cpus() - idle - (cpu1 - self.cpu0) / wall, 0.0)
        pressure = min((psi1 - self.psi0) / 1e6 / wall, 1.0) if psi1 is not None and self.psi0 is not None else None
        return (
            round(idle, 2) if idle is not None else None,
            round(others, 2) if others is not None else None,
            round(pressure, 3) if pressure is not None else None,
        )


def _torch_info(import_torch: bool) -> dict[str, Any] | None:
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch  # noqa: F811
        except ImportError:
            return None
    if torch is None:
        return None
    info: dict[str, Any] = {
        "version": getattr(torch, "__version__", "?"),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "cuda_available": bool(torch.cuda.is_available()),
    }
    if info["cuda_available"]:
        info["cuda_version"] = torch.version.cuda
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
    return info


def capture_environment(*, import_torch: bool = False) -> dict[str, Any]:
    """A dict describing this process's machine; torch is described if imported (or asked for)."""
    from . import __version__

    return {
        "servescope": __version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_available": available_cpus(),
        "torch": _torch_info(import_torch),
    }
