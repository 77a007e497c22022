"""Request bodies from files: read with a size bound, parsed when JSON, typed by content.

    body = read_body("payload.json")                # bytes, as sent
    payload = read_json("payload.json")             # parsed, for a handler
    content_type_of(body)                           # "application/json"

The command line's commands read their ``--body`` files through here, so a missing file, an
oversized one or JSON that does not parse is one clear ``ConfigError`` wherever it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from .exceptions import ConfigError

__all__ = ["MAX_DOCTOR_BYTES", "content_type_of", "read_body", "read_json"]

#: The doctor sends its body dozens of times, concurrently: a bigger one is not representative.
MAX_DOCTOR_BYTES = 32 * 1024 * 1024


def read_body(path: str | Path, *, max_bytes: int | None = None, why: str = "") -> bytes:
    """The file's bytes; a ``ConfigError`` naming the file when it cannot be read or is over
    ``max_bytes`` (``why`` says why the bound exists)."""
    try:
        if max_bytes is not None:
            size = Path(path).stat().st_size
            if size > max_bytes:
                raise ConfigError(
                    f"body file {str(path)!r} is {size / 2**20:.0f} MB: {why or 'too large'}; give a "
                    f"representative request of at most {max_bytes // 2**20} MB"
                )
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read body file {str(path)!r}: {exc.strerror or exc}") from None


def read_json(path: str | Path, *, max_bytes: int | None = None, why: str = "") -> Any:
    """The file parsed as JSON (what a handler that takes a payload receives)."""
    data = read_body(path, max_bytes=max_bytes, why=why)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"body file {str(path)!r} is not valid JSON: {exc}") from None


def content_type_of(body: bytes) -> str:
    """``application/json`` when the body parses as JSON, else ``application/octet-stream``."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return "application/octet-stream"
    return "application/json"
