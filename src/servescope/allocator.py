"""Which memory allocator the process runs on, and whether the user tuned it: the doctor tries
keeping freed memory in the process (``KEEP_FREED``) where the requests fault fresh pages in.

glibc's malloc serves a large buffer (above its mmap threshold, 128 KiB at first, raised as
large buffers are freed) with a fresh mapping, and gives the top of its heap back to the kernel
when more than its trim threshold is free. An endpoint whose forward makes buffers of tens of
MB (a transformer's activations at a long length, an image batch) can then have every request
map and zero its memory again: a MiniLM router at 6 x 256 tokens took 50-60k minor page faults
a request under uvicorn, 245 ms against 186 ms with glibc told to keep them (docs/benchmarks.md).

    allocator()          # "glibc", "jemalloc", "tcmalloc", "mimalloc", or None (cannot tell)
    malloc_setting()     # the user's own setting ("MALLOC_TRIM_THRESHOLD_=..."), or ""
"""

from __future__ import annotations

import os
import platform

__all__ = ["KEEP_FREED", "allocator", "keep_freed_words", "malloc_setting"]

#: glibc keeps freed memory for the next request: buffers up to 32 MiB (the largest threshold
#: it accepts) from its heap, not fresh mappings; up to 1 GiB of free heap kept, not trimmed; and
#: a pad of 64 MiB (a thread's heap's size), without which a thread's emptied heap is unmapped
#: whatever the trim threshold (a `def` route runs on a pool's thread: its MiniLM-sized maps
#: faulted 25k pages a request with the two thresholds alone, 51 with the pad)
KEEP_FREED = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30), "MALLOC_TOP_PAD_": str(64 * 2**20)}
#: a user's setting of glibc's malloc, or an allocator preloaded in its place
_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_OTHERS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_words() -> str:
    return " ".join(f"{k}={v}" for k, v in KEEP_FREED.items())


def allocator(maps: str = "/proc/self/maps") -> str | None:
    """The malloc this process runs on: a preloaded one by its library, else glibc's where the C
    library is glibc; None where it cannot tell (not Linux, musl)."""
    try:
        with open(maps) as f:
            text = f.read()
    except OSError:
        text = ""
    for name in _OTHERS:
        if f"lib{name}" in text:
            return name
    return "glibc" if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" else None


def malloc_setting(environ: os._Environ[str] | dict[str, str] = os.environ) -> str:
    """The user's own setting of the allocator ("MALLOC_TRIM_THRESHOLD_=1000000000", an
    ``LD_PRELOAD`` of jemalloc), or "" where it runs as glibc ships it."""
    for key in _KNOBS:
        if environ.get(key):
            return f"{key}={environ[key]}"
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables:
        return f"GLIBC_TUNABLES={tunables}"
    preload = environ.get("LD_PRELOAD", "")
    if any(name in preload for name in _OTHERS):
        return f"LD_PRELOAD={preload}"
    return ""
