"""Request bodies from files: read with a size bound, parsed when JSON, typed by content.

    body = read_body("payload.json")                # bytes, as sent
    payload = read_json("payload.json")             # parsed, for a handler
    content_type_of(body)                           # "application/json"
    lines = read_jsonl("requests.jsonl")            # [(line number, one body), ...]
    body, content_type = multipart_form([("image", "cat.jpg")])   # a form upload

The command line's commands read their ``--body`` and ``--data`` files through here, so a
missing file, an oversized one or JSON that does not parse is one clear ``ConfigError``
(naming the line, in a data file) wherever it is given.
"""

from __future__ import annotations

import mimetypes
import secrets
from pathlib import Path
from typing import Any

import orjson

from .exceptions import ConfigError

__all__ = [
    "MAX_DATA_BYTES", "MAX_DATA_LINES", "MAX_DOCTOR_BYTES", "content_type_of", "multipart_body", "multipart_form", "read_body", "read_json",
    "read_jsonl",
]  # fmt: skip

#: The doctor sends its body dozens of times, concurrently: a bigger one is not representative.
MAX_DOCTOR_BYTES = 32 * 1024 * 1024
#: bench builds every request of a data file before the run (so sending costs no parsing): the
#: largest file and the most requests it takes
MAX_DATA_BYTES = 1 << 30
MAX_DATA_LINES = 1_000_000


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


def read_jsonl(path: str | Path, *, max_lines: int = MAX_DATA_LINES, max_bytes: int = MAX_DATA_BYTES) -> list[tuple[int, bytes]]:
    """A data file's requests, one JSON value a line: ``(line number, the line)`` for each,
    blank lines skipped. A line that is not JSON, an empty file, or one over ``max_bytes`` or
    ``max_lines`` requests is a ``ConfigError`` that says which and what to do."""
    name = str(path)
    try:
        size = Path(path).stat().st_size
        if size > max_bytes:
            raise ConfigError(
                f"data file {name!r} is {size / 2**20:,.0f} MB: bench builds every request before the run, "
                f"up to {max_bytes // 2**20:,} MB; give a sample (head -n 100000 {name} > sample.jsonl)"
            )
        out: list[tuple[int, bytes]] = []
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ConfigError(f"data file {name!r} line {number} is not JSON: {exc}") from None
                if len(out) == max_lines:
                    raise ConfigError(
                        f"data file {name!r} has more than {max_lines:,} requests: bench builds every request "
                        f"before the run; give a sample (head -n 100000 {name} > sample.jsonl)"
                    )
                out.append((number, line))
    except OSError as exc:
        raise ConfigError(f"cannot read data file {name!r}: {exc.strerror or exc}") from None
    if not out:
        raise ConfigError(f"data file {name!r} holds no request (one JSON body a line)")
    return out


def _quoted(text: str) -> str:
    """A name or file name for a Content-Disposition header, escaped as browsers do (HTML's
    multipart/form-data encoding): quote and line breaks percent-encoded."""
    return text.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


def multipart_form(files: list[tuple[str, str | Path]]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body with each ``(field, path)`` as a file upload, as a browser
    or ``curl -F field=@path`` sends it, and its Content-Type (with the boundary)."""
    return multipart_body([(field, Path(path).name, read_body(path)) for field, path in files])


def multipart_body(parts: list[tuple[str, str, bytes]], boundary: str | None = None) -> tuple[bytes, str]:
    """The ``multipart/form-data`` body of ``(field, file name, content)`` uploads, and its
    Content-Type; with ``boundary`` when no file holds it (another body for the same header)."""
    heads = []
    for field, filename, data in parts:
        ctype = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        head = f'Content-Disposition: form-data; name="{_quoted(field)}"; filename="{_quoted(filename)}"\r\nContent-Type: {ctype}'
        heads.append((head.encode("utf-8"), data))
    while True:  # a boundary that no file holds
        boundary = boundary or f"servescope-{secrets.token_hex(16)}"
        marker = b"--" + boundary.encode()
        if not any(marker in data for _, data in heads):
            break
        boundary = None
    body = b"".join(marker + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n" for head, data in heads) + marker + b"--\r\n"
    return body, f"multipart/form-data; boundary={boundary}"
