"""The ``Server-Timing`` header (W3C Server Timing): ``name;dur=ms;desc="..."``, comma-separated.

    format_server_timing({"infer": 3.2, "serialize": 0.1}, total_ms=3.4)
    # 'infer;dur=3.2, serialize;dur=0.1, total;dur=3.4'
    parse_server_timing('infer;dur=3.2, cache;desc="hit"')
    # [Metric(name='infer', dur_ms=3.2, desc=None), Metric(name='cache', dur_ms=None, desc='hit')]

Browsers' DevTools show this header per request; ``servescope bench`` reads it from any server
to break its latency into stages.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, NamedTuple

from .exceptions import ServerTimingError
from .timing import order_stages

__all__ = ["Metric", "format_server_timing", "parse_server_timing", "server_timing_durations"]

#: The metric name servescope uses for the server's whole handling time.
TOTAL = "total"
#: The longest duration taken as a stage's (one day): past it a value is no timing but a broken
#: or hostile server (``dur=1e300`` parses as a number, and overflows what records it).
MAX_DUR_MS = 86_400_000.0

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_OWS = re.compile(r"[ \t]*")
_BAD_TOKEN_CHAR = re.compile(r"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
# the form servers send (``name;dur=1.25, ...``, servescope's own included): read by two C
# passes; anything else (desc, flags, exponents) goes through the full grammar
_PLAIN_ITEM = r"[ \t]*{name}[ \t]*;[ \t]*[dD][uU][rR][ \t]*=[ \t]*{dur}[ \t]*"
_PLAIN_ENTRY = re.compile(_PLAIN_ITEM.format(name=r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+)", dur=r"([0-9]+(?:\.[0-9]*)?)"))
_PLAIN_LIST = re.compile(
    "{0}(?:,{0})*".format(_PLAIN_ITEM.format(name=r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", dur=r"[0-9]+(?:\.[0-9]*)?"))
)


class Metric(NamedTuple):
    name: str
    dur_ms: float | None
    desc: str | None


_TOKENS: dict[str, str] = {}
_PREFIXES: dict[tuple[str, ...], list[tuple[str, str]]] = {}


def _token(name: str) -> str:
    token = _TOKENS.get(name)
    if token is None:
        token = _BAD_TOKEN_CHAR.sub("_", name) or "_"
        if len(_TOKENS) < 4096:
            _TOKENS[name] = token
    return token


def format_server_timing(
    durations_ms: Mapping[str, float] | Any, *, total_ms: float | None = None, precision: int = 3
) -> str:
    """Format stage durations (a mapping, or a finished ``Trace``) as a header value.

    Names that are not HTTP tokens have their other characters replaced by ``_``.
    """
    if hasattr(durations_ms, "durations_ms") and hasattr(durations_ms, "total_ms"):
        trace = durations_ms
        durations_ms = trace.durations_ms
        if total_ms is None:
            total_ms = trace.total_ms
    parts = []
    for name, dur in durations_ms.items():
        if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
            raise ServerTimingError(f"stage {name!r}: duration must be finite and >= 0 ms, got {dur!r}")
        parts.append(f"{_token(name)};dur={round(dur, precision):g}")
    if total_ms is not None:
        parts.append(f"{TOTAL};dur={round(total_ms, precision):g}")
    return ", ".join(parts)


def format_ns(durations_ns: Mapping[str, int], total_ns: int | None = None) -> str:
    """The hot-path form for durations a trace measured (valid by construction): ns in,
    microsecond precision out."""
    key = tuple(durations_ns)
    prefixes = _PREFIXES.get(key)
    if prefixes is None:  # an endpoint's requests see the same few stage sets
        prefixes = [(name, f"{_token(name)};dur=") for name in order_stages(key)]
        if len(_PREFIXES) < 1024:
            _PREFIXES[key] = prefixes
    parts = [f"{prefix}{durations_ns[name] / 1e6:.3f}" for name, prefix in prefixes]
    if total_ns is not None:
        parts.append(f"{TOTAL};dur={total_ns / 1e6:.3f}")
    return ", ".join(parts)


def parse_server_timing(value: str) -> list[Metric]:
    """Parse a header value (several header lines may be joined with ``,``).

    Raises ``ServerTimingError`` naming the position of the first malformed part.
    """
    if not isinstance(value, str):
        raise ServerTimingError(f"a Server-Timing value must be a string, got {type(value).__name__}")
    metrics: list[Metric] = []
    pos, n = 0, len(value)

    def fail(what: str) -> ServerTimingError:
        return ServerTimingError(f"malformed Server-Timing at character {pos}: {what} in {value!r}")

    def skip_ows() -> None:
        nonlocal pos
        pos = _OWS.match(value, pos).end()  # type: ignore[union-attr]

    skip_ows()
    if pos == n:
        return metrics
    while True:
        m = _TOKEN.match(value, pos)
        if not m:
            raise fail("expected a metric name")
        name, pos = m.group(), m.end()
        dur: float | None = None
        desc: str | None = None
        skip_ows()
        while pos < n and value[pos] == ";":
            pos += 1
            skip_ows()
            m = _TOKEN.match(value, pos)
            if not m:
                raise fail("expected a parameter name after ';'")
            param, pos = m.group().lower(), m.end()
            skip_ows()
            pval: str | None = None
            if pos < n and value[pos] == "=":
                pos += 1
                skip_ows()
                q = _QUOTED.match(value, pos)
                t = _TOKEN.match(value, pos)
                if q:
                    pval, pos = re.sub(r"\\(.)", r"\1", q.group(1)), q.end()
                elif t:
                    pval, pos = t.group(), t.end()
                else:
                    raise fail(f"expected a value for {param!r}")
                skip_ows()
            if param == "dur" and dur is None:  # the spec keeps the first of repeated params
                try:
                    dur = float(pval) if pval is not None else None
                except ValueError:
                    dur = None
                if dur is None or not math.isfinite(dur) or dur < 0:
                    raise fail(f"dur must be a finite number >= 0, got {pval!r}")
            elif param == "desc" and desc is None:
                desc = pval
        metrics.append(Metric(name, dur, desc))
        if pos == n:
            return metrics
        if value[pos] != ",":
            raise fail(f"expected ',' or ';', got {value[pos]!r}")
        pos += 1
        skip_ows()


def server_timing_durations(value: str) -> tuple[dict[str, float], float | None]:
    """Stage durations (summed per name) and the ``total`` entry, if any, from a header value.

    Metrics without ``dur`` (descriptions, flags) are left out. A duration (or a name's sum)
    over one day (``MAX_DUR_MS``) raises ``ServerTimingError``: it is not a stage's time.
    """
    stages: dict[str, float] = {}
    total: float | None = None
    if _PLAIN_LIST.fullmatch(value) is not None:
        pairs: Any = ((name, float(dur)) for name, dur in _PLAIN_ENTRY.findall(value))
    else:
        pairs = ((m.name, m.dur_ms) for m in parse_server_timing(value) if m.dur_ms is not None)
    for name, ms in pairs:
        if name == TOTAL:
            total = ms
        else:
            stages[name] = stages.get(name, 0.0) + ms
    if (total is not None and total > MAX_DUR_MS) or any(ms > MAX_DUR_MS for ms in stages.values()):
        raise ServerTimingError(
            f"a duration over one day ({MAX_DUR_MS:.0f} ms) is no stage's time in {value[:200]!r}"
        )
    return stages, total
