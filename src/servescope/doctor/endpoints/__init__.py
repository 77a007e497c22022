"""The endpoints the doctor can examine, one module per kind behind one ``Endpoint`` protocol
(base.py): a plain function (function.py), an ASGI or a WSGI app (http.py)."""

from __future__ import annotations

import inspect
from typing import Any

import orjson

from ...exceptions import ConfigError
from .base import UNFINISHED, Observation, Endpoint, untraced_load
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
    "untraced_load",
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


def make_endpoint(obj: Any, *, path: str, send: Any = None, method: str | None = None) -> Endpoint:
    """The right target for what the user pointed at: a handler, an ASGI/WSGI app, or what
    ``servescope serve`` takes (a ``servescope.Model`` class or instance). For an app, ``send``
    (doctor/send.py) and ``method`` set what it is sent: the route's own method unless given,
    checked against the methods the route takes."""
    from ...serve import model_of

    model = model_of(obj)  # (a Model subclass is built, with no arguments, as serve builds it)
    if model is not None:
        from ...serve import as_app

        obj = as_app(model)
    if is_asgi(obj) or is_wsgi(obj):
        ep: Any = ASGIEndpoint(obj, path) if is_asgi(obj) else WSGIEndpoint(obj, path)
        if send is not None:
            from ..send import route_method

            ep.method = route_method(ep.routes(), send, method)
            ep.content_type = send.content_type
        return ep
    if callable(obj) and not isinstance(obj, type):
        if method is not None or (send is not None and send.files):
            raise ConfigError("a handler is called with the JSON body: --method and --file are for apps")
        if send is not None and send.payload is None:
            raise ConfigError("give --body FILE: the JSON request body to send (a handler gets it parsed)")
        return FunctionEndpoint(obj)
    raise ConfigError(f"{obj!r} is neither a callable handler, an ASGI/WSGI app nor a servescope.Model")


def payload_bytes(payload: Any) -> bytes:
    return orjson.dumps(payload)
