"""The endpoints the doctor can examine, one module per kind behind one ``Endpoint`` protocol
(base.py): a plain function (function.py), an ASGI or a WSGI app (http.py)."""

from __future__ import annotations

import inspect
from typing import Any

import orjson

from ...exceptions import ConfigError
from .base import UNFINISHED, Observation, Endpoint
from .function import FunctionEndpoint, describe_failure
from .http import ASGIEndpoint, WSGIEndpoint, free_port

__all__ = [
    "ASGIEndpoint",
    "FunctionEndpoint",
    "Observation",
    "Endpoint",
    "UNFINISHED",
    "WSGIEndpoint",
    "describe_failure",
    "free_port",
    "is_asgi",
    "is_wsgi",
    "make_endpoint",
    "payload_bytes",
]


def is_asgi(obj: Any) -> bool:
    """An ASGI app: FastAPI/Starlette, or a coroutine taking (scope, receive, send)."""
    call = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "__call__", None)
    if call is None:
        return False
    if type(obj).__module__.startswith(("fastapi", "starlette")):
        return True
    try:
        params = list(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        return False
    return inspect.iscoroutinefunction(call) and params[:3] == ["scope", "receive", "send"]


def is_wsgi(obj: Any) -> bool:
    """A WSGI app: Flask, or a callable taking (environ, start_response)."""
    if type(obj).__module__.startswith("flask") or hasattr(obj, "wsgi_app"):
        return True
    try:
        params = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return False
    return params[:2] == ["environ", "start_response"]


def make_endpoint(obj: Any, *, path: str) -> Endpoint:
    """The right target for what the user pointed at."""
    if is_asgi(obj):
        return ASGIEndpoint(obj, path)
    if is_wsgi(obj):
        return WSGIEndpoint(obj, path)
    if callable(obj) and not isinstance(obj, type):
        return FunctionEndpoint(obj)
    raise ConfigError(f"{obj!r} is neither a callable handler nor an ASGI/WSGI app")


def payload_bytes(payload: Any) -> bytes:
    return orjson.dumps(payload)
