"""How hard the doctor examines an endpoint, and what it sends it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..exceptions import ConfigError
from ..payload import MAX_DOCTOR_BYTES, read_body
from .send import METHODS

__all__ = ["MIN_OK_REQUESTS", "MIN_OK_SHARE", "DoctorOptions"]

#: At least this many warm requests, and this share of them, must succeed to diagnose.
MIN_OK_REQUESTS, MIN_OK_SHARE = 3, 0.5


@dataclass(kw_only=True)
class DoctorOptions:
    """How hard the doctor examines an endpoint. Keyword-only, validated at construction.

    ``requests`` warm requests one at a time (at least 3), then ``concurrent_requests`` from
    ``concurrency`` callers at once (default: six each, at least 24), each request at most
    ``timeout_s``; ``path`` is the route an app is sent to (with its query string), by
    ``method``, with the JSON payload or the ``files`` as a form."""

    path: str = "/predict"
    #: the HTTP method for an app; None: the route's own (POST or GET as there is a body when it takes several)
    method: str | None = None
    #: ``(field, path)`` of files uploaded as a multipart form (instead of a JSON body)
    files: tuple[tuple[str, str], ...] = ()
    requests: int = 30
    concurrency: int = 8
    concurrent_requests: int | None = None
    timeout_s: float = 30.0
    #: time for measuring the endpoint (start, cold, sequential and concurrent requests)
    max_seconds: float = 28.0
    batch_probe: tuple[int, ...] = (1, 2, 4, 8, 16)
    #: time for trying fixes on the endpoint (doctor/experiments/); 0 tries none
    experiment_seconds: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigError(f"path must start with '/', got {self.path!r}")
        if self.method is not None and self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self.files = tuple((str(f), str(p)) for f, p in self.files)
        for f, p in self.files:
            if not f or not os.path.isfile(p):
                raise ConfigError(f"--file {f}={p}: " + ("no such file" if f else "give the form field's name"))
        if not isinstance(self.requests, int) or self.requests < MIN_OK_REQUESTS:
            raise ConfigError(f"requests must be a whole number >= {MIN_OK_REQUESTS}, got {self.requests!r}")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigError(f"concurrency must be a whole number >= 1, got {self.concurrency!r}")
        if self.concurrent_requests is None:
            self.concurrent_requests = max(self.concurrency * 6, 24)
        elif not isinstance(self.concurrent_requests, int) or self.concurrent_requests < 1:
            raise ConfigError(f"concurrent_requests must be a whole number >= 1, got {self.concurrent_requests!r}")
        for name in ("timeout_s", "max_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(self.experiment_seconds, (int, float)) or not 0 <= self.experiment_seconds < math.inf:
            raise ConfigError(f"experiment_seconds must be a number of seconds >= 0, got {self.experiment_seconds!r}")


    def upload(self) -> list[tuple[str, str, bytes]]:
        """The files to upload, read: (field, file name, content)."""
        return [(f, os.path.basename(p), read_body(p, max_bytes=MAX_DOCTOR_BYTES, why="the doctor sends it dozens of times")) for f, p in self.files]
