"""The evidence record of the request running in this context: what the probes count
(loads, copies, model calls ...), one dict per request, in a ContextVar the doctor sets."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

__all__ = ["current_evidence", "new_evidence", "reset_evidence", "set_evidence"]

_evidence: ContextVar[dict[str, Any] | None] = ContextVar("servescope_evidence", default=None)
#: set while a probed model call that is not a torch module runs (``encode``, a pipeline): the
#: torch modules it calls are part of it, not forwards of their own
_in_model_call: ContextVar[bool] = ContextVar("servescope_in_model_call", default=False)


def new_evidence() -> dict[str, Any]:
    return {
        "loads": 0,
        "load_calls": [],
        "constructed": 0,
        "params_built": 0,
        "load_windows": [],
        "load_keys": [],  # each load call's key (probes.load_key), beside load_calls
        "first_init_ns": None,
        "last_init_ns": None,
        "module_moves": 0,
        "h2d": 0,
        "d2h": 0,
        "copy_bytes": 0,
        "small_copies": 0,
        "unpinned_async": 0,
        "syncs": 0,
        "forwards": [],
    }


def current_evidence() -> dict[str, Any] | None:
    """The evidence record of the request this code runs for; None outside any, and once that
    request has ended (a thread it started that outlives it, a pool's thread it made, works
    for no request after)."""
    ev = _evidence.get()
    return None if ev is None or ev.get("ended") else ev


def end_evidence(ev: dict[str, Any]) -> None:
    """The request of ``ev`` has ended: code still carrying it records nothing more in it."""
    ev["ended"] = True


def set_evidence(ev: dict[str, Any] | None) -> Any:
    """Make ``ev`` the evidence record of the request running in this context."""
    return _evidence.set(ev)


def reset_evidence(token: Any) -> None:
    _evidence.reset(token)


def _loop_running() -> bool:
    return asyncio._get_running_loop() is not None
