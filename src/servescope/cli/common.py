"""What every command shares: the parser, argument types, and the option groups that make
one flag mean one thing in every command.

A command is a module with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args, console) -> int`` (the ``Command`` protocol); ``cli/__init__.py`` lists them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, Protocol

from rich.console import Console

from ..exceptions import ServescopeError

SEVERITY_CHOICES = ["critical", "high", "medium", "low", "info"]
#: ``--json`` without a file, or ``--json -``: the report goes to stdout (and the table to stderr)
STDOUT = "-"


class Command(Protocol):
    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, console: Console) -> int: ...


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


# -- argument types: each turns text into a value or says, in one line, what it wanted ----------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = positive_int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def duration(text: str) -> float:
    from ..load.bench import parse_duration

    try:
        return parse_duration(text)
    except ServescopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 1,2,4, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return values


def rate_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected requests/s like 100 or 50,100,200, got {text!r}") from None
    if any(not v > 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"a rate must be > 0 requests/s, got {text!r}")
    return values


def header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


class Deprecated(argparse.Action):
    """An old spelling kept for one release: it stores its value as before and says what to use."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        sys.stderr.write(f"servescope: {option_string} is deprecated and will be removed: use {self.new}\n")
        setattr(namespace, self.dest, values)


# -- option groups: the same flag, the same meaning, in every command that takes it -------------


def add_body(parser: argparse.ArgumentParser, *, many: bool, old: str | None = None) -> None:
    """``--body FILE``: the request body, from a file (a handler gets it parsed as JSON)."""
    if many:
        parser.add_argument("--body", metavar="FILE", action="append", default=[], help="request body from a file; repeat to cycle several")
    else:
        parser.add_argument("--body", metavar="FILE", help="the JSON request body, from a file (a handler gets it parsed)")
    if old:  # (one body: a repeatable old spelling would need to append)
        parser.add_argument(old, dest="body", metavar="FILE", action=Deprecated, new="--body", help=argparse.SUPPRESS)


def file_field(text: str) -> tuple[str, str]:
    field, sep, path = text.partition("=")
    if not sep or not field or not path:
        raise argparse.ArgumentTypeError(f"expected FIELD=PATH (e.g. image=cat.jpg), got {text!r}")
    return field, path.removeprefix("@")


def add_file(parser: argparse.ArgumentParser) -> None:
    """``--file FIELD=PATH``: a form upload, as ``curl -F FIELD=@PATH``."""
    parser.add_argument(
        "--file", metavar="FIELD=PATH", action="append", default=[], type=file_field,
        help="upload PATH as form field FIELD (multipart/form-data, as curl -F FIELD=@PATH); repeatable",
    )  # fmt: skip


def add_timeout(parser: argparse.ArgumentParser, *, default: float | None, what: str = "per-request timeout") -> None:
    shown = f"default {default:g}s" if default is not None else "default 30s"
    parser.add_argument("--timeout", metavar="DURATION", type=duration, default=default, help=f"{what} ({shown})")


def add_requests(parser: argparse.ArgumentParser, *, default: int | None, low: int, what: str) -> None:
    parser.add_argument("-n", "--requests", metavar="N", type=at_least(low), default=default, help=what)


def add_outputs(parser: argparse.ArgumentParser) -> None:
    """``--json [FILE]`` and ``--html FILE``: where the report goes besides the terminal."""
    parser.add_argument("--json", metavar="FILE", nargs="?", const=STDOUT, help="write the report as JSON to FILE (no FILE, or -: to stdout, the table then goes to stderr)")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")


def add_fail_on(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fail-on", choices=SEVERITY_CHOICES, help="exit 1 when a finding this bad or worse is present (3 when it could not diagnose, always)")


def add_ray(parser: argparse.ArgumentParser, what: str) -> None:
    """``--ray [ADDRESS]``: on a Ray cluster; without ADDRESS, one started here."""
    parser.add_argument("--ray", metavar="ADDRESS", nargs="?", const="local", help=f"{what}: auto, HOST:PORT, ray://HOST:PORT, or none (start one here)")


def add_listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", metavar="HOST", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", metavar="PORT", type=port, default=8000, help="port to listen on (default 8000)")


def check_port_free(host: str, port: int) -> None:
    """Refuse at once (before loading a model for a minute) a port something else listens on."""
    import socket

    from ..exceptions import ConfigError

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server there? pick --port)") from None


# -- output -------------------------------------------------------------------------------------


def table_console(args: argparse.Namespace, console: Console) -> Console:
    """Where the table goes: stderr when the JSON report takes stdout."""
    if getattr(args, "json", None) == STDOUT:
        return Console(file=sys.stderr, width=console.width)
    return console


def write_outputs(report: Any, args: argparse.Namespace, console: Console, **html_options: Any) -> None:
    """The report to ``--json`` (a file, or stdout) and ``--html``, as the command asked."""
    from pathlib import Path

    from ..renderers import render_json
    from ..renderers.html import render_html

    if args.json == STDOUT:
        sys.stdout.write(render_json(report) + "\n")
    elif args.json:
        report.save(args.json)
        console.print(f"Report saved to {args.json}")
    if getattr(args, "html", None):
        Path(args.html).write_text(render_html(report, **html_options))
        console.print(f"HTML report saved to {args.html}")
