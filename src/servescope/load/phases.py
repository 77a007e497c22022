"""The HTTP phases of a run (``load.http``): connections set up, time to first byte, transfer.

    http = http_phases(measured, dns_ns=gen.dns_ns, connects=gen.connects)

The generator reads the clock when a response's first bytes arrive (``Result.first_ns``) and
times each connection it opens: the host's name looked up once a run (as wrk and most clients
do), then the TCP handshake and, for https, the TLS one. A closed loop's latency counts from
the send on a connection already open, so set-up is reported beside it, not inside it.
"""

from __future__ import annotations

from ..sections import Http
from ..stats import Distribution
from .wire import Result, error_kind

__all__ = ["http_phases"]


def http_phases(measured: list[Result], *, dns_ns: int | None, connects: list[tuple[int, int]]) -> Http | None:
    """``load.http`` from the measured requests and the level's connections; None when no
    connection was opened and no response came (nothing to say)."""
    ttfb, transfer = Distribution(), Distribution()
    for r in measured:
        if r.first_ns and error_kind(r) is None:
            ttfb.add(max(r.first_ns - r.sent_ns, 0) / 1e6)
            transfer.add(max(r.done_ns - r.first_ns, 0) / 1e6)
    if not connects and not len(ttfb):
        return None
    connect, tls = Distribution(), Distribution()
    for tcp_ns, tls_ns in connects:
        connect.add(tcp_ns / 1e6)
        if tls_ns:
            tls.add(tls_ns / 1e6)
    dists = {"connect": connect, "ttfb": ttfb, "transfer": transfer}
    if len(tls):
        dists["tls"] = tls
    return Http.from_distributions(
        dists, connections=len(connects), dns_ms=None if dns_ns is None else round(dns_ns / 1e6, 3)
    )
