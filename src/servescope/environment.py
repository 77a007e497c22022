"""What a run ran on: Python, CPUs really available, torch and its device, threads."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

__all__ = ["available_cpus", "capture_environment", "idle_cpu_seconds"]


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
