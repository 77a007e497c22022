"""Whether the doctor could diagnose the endpoint at all, and if not why, in a line a user can
act on: the start-up's error, the warm requests that failed and what the endpoint raised, a
route or method that does not exist, a payload the app rejected."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..sections import Verdict
from .endpoints import Observation
from .failures import known_failure
from .options import MIN_OK_REQUESTS, MIN_OK_SHARE
from .send import allowed_methods

__all__ = ["verdict_of"]


def verdict_of(
    cold: Observation | None,
    warm: list[Observation],
    conc: list[Observation],
    *,
    start_error: str | None,
    raised: Callable[[], list[str]],
    endpoint: Any,
    path: str,
) -> Verdict:
    """The run's verdict from its requests (``raised()``: the endpoint's exceptions, as its
    server logged them)."""
    failures: dict[str, int] = {}
    for o in [cold, *warm, *conc]:
        if o is not None and o.error:
            kind = o.error.split(":", 1)[0]
            failures[kind] = failures.get(kind, 0) + 1
    v = Verdict(failures=failures)
    if start_error:
        v.diagnosed, v.reason = False, start_error
        return v
    ok = [w for w in warm if w.error is None]
    if len(ok) >= max(MIN_OK_REQUESTS, math.ceil(MIN_OK_SHARE * len(warm))):
        return v
    v.diagnosed, v.reason = False, _reason(cold, warm, len(ok), raised)
    _hint(v, {o.status for o in [cold, *warm] if o is not None and o.error}, endpoint, path)
    return v


def _reason(cold: Observation | None, warm: list[Observation], ok: int, raised: Callable[[], list[str]]) -> str:
    if not warm:
        return "no warm request ran: " + (f"the first request failed ({cold.error})" if cold and cold.error else "the time ran out")
    errors = [w.error for w in warm if w.error]
    if not errors:
        return f"only {ok} warm requests ran; at least {MIN_OK_REQUESTS} are needed"
    reason = f"{len(errors)} of {len(warm)} warm requests failed; the first: {errors[0]}"
    summaries = raised()
    if summaries:  # the server's log says why: the reason a user needs first
        reason += f"; the endpoint raised: {'; '.join(summaries[:2])}"
        known = next((k for k in map(known_failure, summaries) if k), None)
        if known is not None:  # its cause, in a line (the fix's first comment)
            reason += f". Known cause: {known.splitlines()[0].lstrip('# ')} ..."
    return reason


def _hint(v: Verdict, statuses: set[int | None], endpoint: Any, path: str) -> None:
    """What to change in the command: another route or method, or the payload."""
    if statuses & {404, 405}:
        routes = endpoint.routes()
        v.routes = [f"{' '.join(m) or 'ANY'} {p}" for p, m in routes]
        method = getattr(endpoint, "method", "POST")
        allowed = allowed_methods(routes, path)
        others = [p for p, m in routes if method in m and p != path]
        if allowed is not None and method in allowed:
            v.hint = f"{method} {path} exists: the endpoint itself answered {min(statuses & {404, 405})} (see its answer above)"
        elif allowed:
            v.hint = f"{path} takes {', '.join(allowed)}, not {method}: try --method {allowed[0]}"
        elif others:
            v.hint = f"the app has no {method} route at {path}: try --path {others[0]}"
        else:
            v.hint = f"the app has no {method} route at {path}; its routes are listed below"
    elif 422 in statuses or 400 in statuses:
        v.hint = "the app rejected the payload: make --body a request the endpoint accepts"
