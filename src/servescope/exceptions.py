"""servescope's exceptions: one tree, rooted in ``ServescopeError``.

    ServescopeError
    ├── StageError (TypeError)          a stage name that is not a non-empty string
    ├── RecordError (ValueError)        a duration that is negative or not finite
    ├── ServerTimingError (ValueError)  a malformed ``Server-Timing`` header value
    ├── ReportError (ValueError)        a report that cannot be read
    │   └── SchemaError                 a report of an unknown or newer schema
    ├── ConfigError (ValueError)        a bad setting: a keyword argument, a CLI option, a file
    │                                   that is not what it should be; fixed by changing it
    ├── EndpointError                   what is measured could not be started, reached or measured:
    │                                   an endpoint that refuses connections or fails its start-up,
    │                                   a Ray cluster that does not answer, every load generator lost
    ├── InvalidPayload (ValueError)     raised by a Model's validate(): its text is for the client
    └── MissingDependencyError (ImportError)  an optional extra is not installed

Every message says what happened, why, and what fixes it.
"""

from __future__ import annotations


class ServescopeError(Exception):
    """Base class of every error servescope raises on purpose."""


class StageError(ServescopeError, TypeError):
    """A stage name was not a non-empty string."""


class RecordError(ServescopeError, ValueError):
    """A duration could not be recorded (negative, NaN or infinite)."""


class ServerTimingError(ServescopeError, ValueError):
    """A ``Server-Timing`` header value was malformed."""


class ReportError(ServescopeError, ValueError):
    """A saved report could not be read."""


class SchemaError(ReportError):
    """A report's schema is unknown or newer than this servescope understands."""


class ConfigError(ServescopeError, ValueError):
    """A setting was invalid (a keyword argument, a CLI option): the same call with a valid
    one would work. Something that could not be reached or started is an ``EndpointError``."""


class EndpointError(ServescopeError):
    """The endpoint under test, or what drives load to it, could not be started, reached or
    measured: its own failure (or the network's), not a bad setting.

        try:
            run_bench(BenchOptions(url="http://127.0.0.1:8000/predict"))
        except EndpointError as exc:  # "cannot reach http://127.0.0.1:8000/predict: connection refused"
            ...
    """


class InvalidPayload(ServescopeError, ValueError):
    """Raise it from ``Model.validate`` to reject a request: its message (and ``field``) go to
    the client in the 422. Any other exception there is answered in general terms (its text
    may carry secrets) and logged.

        raise servescope.InvalidPayload("x needs 4 numbers", field="x")
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class MissingDependencyError(ServescopeError, ImportError):
    """An optional integration is used but its package is not installed."""


def require(module: str, extra: str, why: str = "") -> object:
    """Import an optional dependency, or raise an error that names the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        hint = f"pip install 'servescope[{extra}]'"
        if top == "torch":
            hint += " (servescope does not pin torch, so your CUDA build stays)"
        reason = f" {why}" if why else ""
        raise MissingDependencyError(f"{top} is not installed:{reason} `{hint}`") from exc
