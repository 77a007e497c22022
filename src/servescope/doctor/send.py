"""What the doctor sends an app: the method, the route with its query string, and the body
(JSON, or a multipart form with files), and another request like it with what reaches the
model changed (is the model's input the same whatever it is asked?).

    send = Send.of({"text": "hi"}, path="/predict")
    send = Send.of(path="/v1/embed", files=[("image", "cat.jpg", raw)])
    method = route_method(app_routes, send, None)      # the route's own, or refused
    other, why = send.varied()     # (None, why) when nothing in it can be varied

``route_method`` picks the route's own method when the app declares one, and refuses a method
the route does not take, naming those it does.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..exceptions import ConfigError
from ..payload import multipart_body
from .inputs import IMAGE_MAGIC, vary, vary_image

__all__ = ["BODY_METHODS", "METHODS", "Send", "allowed_methods", "route_method"]

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: the methods whose requests carry a body
BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True)
class Send:
    path: str = "/predict"
    payload: Any = None  # the JSON body, parsed; None: no JSON body
    files: tuple[tuple[str, str, bytes], ...] = ()  # (field, file name, content) of a form upload
    body: bytes = field(default=b"", compare=False)
    content_type: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, payload: Any = None, *, path: str = "/predict", files: Any = (), boundary: str | None = None) -> Send:
        files = tuple(files)
        if files and payload is not None:
            raise ConfigError("a form upload is the body: send a JSON payload or files, not both")
        if files:
            body, ctype = multipart_body(list(files), boundary)
        elif payload is not None:
            body, ctype = orjson.dumps(payload), "application/json"
        else:
            body, ctype = b"", None
        return cls(path, payload, files, body, ctype)

    def varied(self) -> tuple[Send | None, str]:
        """Another request of the same shape with what reaches the model changed, or None and why not."""
        path = _vary_query(self.path)
        if self.files:
            files = tuple((f, name, _vary_file(data)) for f, name, data in self.files)
            changed = files != self.files or path != self.path
            # the same boundary: the endpoint sends every body with the first one's Content-Type
            boundary = (self.content_type or "").partition("boundary=")[2] or None
            other = Send.of(path=path, files=files, boundary=boundary) if changed else None
            if other is not None and other.content_type != self.content_type:
                return None, "the varied files hold the form's boundary"
            return other, "" if changed else "the uploaded files are neither images nor text, so they were not varied"
        payload = vary(self.payload) if self.payload is not None else None
        if payload == self.payload and path == self.path:
            return None, "the request has no text, decimal number, array or image to vary"
        return Send.of(payload, path=path), ""

    def describe(self, method: str | None) -> str:
        """What was sent, in words: "PUT /v1/embed, a JSON body" (``method`` None: a handler)."""
        body = f"a form upload ({', '.join(f for f, _, _ in self.files)})" if self.files else "a JSON body" if self.payload is not None else "no body"
        return f"{method} {self.path}, {body}" if method else "the handler called with a JSON payload"


def _vary_query(path: str) -> str:
    """The query string's free text and decimals varied (``?q=red shoes`` -> ``?q=red shoes
    and more``); whole numbers (ids, counts), switches (``true``) and short codes (``en``)
    stay, as the endpoint may refuse other values."""
    route, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    out = []
    for k, v in pairs:
        try:
            number = float(v)
        except ValueError:
            free_text = (" " in v or len(v) >= 4) and v.lower() not in _SWITCHES
            out.append((k, vary(v) if free_text else v))
            continue
        decimal = "." in v and math.isfinite(number)
        out.append((k, f"{vary(number):.6g}" if decimal else v))
    # (nothing varied: the path as it was, not re-encoded, or a request that did not change
    # would pass for one that did)
    return route + "?" + urllib.parse.urlencode(out) if out != pairs else path


#: query values that are switches, not text (left as they are, as short codes like ``en``)
_SWITCHES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null", "auto"})


def _vary_file(data: bytes) -> bytes:
    """An image with a band of pixels inverted; a table (CSV, TSV) with its decimals nudged,
    or its last row once more; other text with a word added; anything else as it is."""
    if data.startswith(IMAGE_MAGIC):
        return vary_image(data) or data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    if not text.strip() or not all(c.isprintable() or c in "\t\r\n" for c in text[:4096]):
        return data  # (control characters: data that only decodes as UTF-8)
    table = _vary_table(text)
    return (table if table is not None else text.rstrip("\n") + " and more\n").encode()


_DECIMAL = re.compile(r"-?\d+\.\d+")


def _vary_table(text: str) -> str | None:
    """A delimited table (a header and rows with the same number of ``,``, tab or ``;``) with
    each decimal cell nudged, or with no decimal its last row once more; None for other text.
    A word added to a table would land in its last cell (a number the endpoint then cannot
    read: a churn scorer's upload failed on '0 and more')."""
    lines = text.splitlines()
    rows = [line for line in lines if line.strip()]
    if len(rows) < 2:
        return None
    sep = next((d for d in (",", "\t", ";") if rows[0].count(d) >= 1 and all(r.count(d) == rows[0].count(d) for r in rows)), None)
    if sep is None:
        return None
    out = [sep.join(f"{vary(float(c)):.6g}" if _DECIMAL.fullmatch(c.strip()) else c for c in line.split(sep)) for line in lines]
    if out == lines:
        out = [*lines, rows[-1]]
    return "\n".join(out) + "\n"


_PARAM = re.compile(r"\{[^}]*\}|<[^>]*>")


def _route_pattern(route: str) -> re.Pattern[str]:
    """A route's path as a pattern: Starlette's ``{name}`` and ``{name:path}``, Flask's
    ``<name>``, ``<int:name>`` and ``<path:name>``."""
    out, last = [], 0
    for m in _PARAM.finditer(route):
        out.append(re.escape(route[last : m.start()]))
        out.append(".+" if ":path" in m.group() or m.group().startswith("<path:") else "[^/]+")
        last = m.end()
    out.append(re.escape(route[last:]))
    return re.compile("".join(out) + "$")


def allowed_methods(routes: list[tuple[str, list[str]]], path: str) -> list[str] | None:
    """The methods the app's routes take at ``path`` (its query string aside); None when the
    app lists no route there (or lists none at all: a plain ASGI callable), or one there takes any."""
    route = path.partition("?")[0]
    found = [m for p, m in routes if _route_pattern(p).match(route)]
    if not found or any(not ms for ms in found):  # (a route that lists no methods takes any)
        return None
    return sorted({x for ms in found for x in ms if x not in ("HEAD", "OPTIONS")} or {"GET"})


def route_method(routes: list[tuple[str, list[str]]], send: Send, given: str | None) -> str:
    """The method to send: ``given`` (checked against what the route takes), else the route's
    own (one method, or POST/GET as the request has a body or not when it takes several)."""
    allowed = allowed_methods(routes, send.path)
    has_body = bool(send.body)
    if given is not None:
        if allowed is not None and given not in allowed:
            raise ConfigError(f"{send.path.partition('?')[0]} does not take {given}: it takes {', '.join(allowed)}")
        method = given
    elif allowed is not None and len(allowed) == 1:
        method = allowed[0]
    elif allowed is not None and not has_body and "GET" in allowed:
        method = "GET"
    elif allowed is None:
        method = "POST" if has_body else "GET"
    else:  # (a route that takes several: the one that fits the request)
        method = next((m for m in ("POST", *BODY_METHODS) if m in allowed), allowed[0]) if has_body else allowed[0]
    if method == "GET" and has_body:
        raise ConfigError(f"GET {send.path} with a body: a GET carries its input in the query string (--path '/route?x=1'); drop --body")
    if method in BODY_METHODS and not has_body:
        raise ConfigError(f"{method} {send.path.partition('?')[0]} takes a body: give --body FILE (JSON) or --file FIELD=PATH")
    return method
