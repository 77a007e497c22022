"""servescope: where an inference endpoint's time goes, why, and the fix.

    import servescope

    with servescope.trace() as t:
        with servescope.stage("infer"):
            y = model(x)
    print(t.durations_ms)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .exceptions import (
    ConfigError,
    EndpointError,
    InvalidPayload,
    MissingDependencyError,
    RecordError,
    ReportError,
    SchemaError,
    ServerTimingError,
    ServescopeError,
    StageError,
)
from .recorder import Recorder
from .serve import Model, serve
from .report import Finding, Report
from .servertiming import format_server_timing, parse_server_timing
from .stats import Distribution
from .timing import CANONICAL_STAGES, CudaEventClock, SyncClock, Trace, WallClock, current_trace, stage, trace

__all__ = [
    "CANONICAL_STAGES",
    "ConfigError",
    "CudaEventClock",
    "Distribution",
    "EndpointError",
    "Finding",
    "InvalidPayload",
    "MissingDependencyError",
    "Model",
    "Recorder",
    "RecordError",
    "Report",
    "ReportError",
    "SchemaError",
    "ServerTimingError",
    "ServescopeError",
    "StageError",
    "SyncClock",
    "Trace",
    "WallClock",
    "__version__",
    "current_trace",
    "format_server_timing",
    "parse_server_timing",
    "serve",
    "stage",
    "trace",
]
