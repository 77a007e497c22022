"""The command line: one module per command, the options they share in ``common.py``.

Each command parses its arguments, builds library objects and renders; the logic lives in
the library (``servescope.doctor``, ``servescope.load.bench``, ``servescope.serve`` ...). A new
command is a module with ``NAME``, ``HELP``, ``add_arguments`` and ``run``, listed in
``COMMANDS``; docs/cli.md is generated from the parser (``python -m servescope.cli.reference``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from rich.console import Console

from .. import __version__
from ..exceptions import ServescopeError
from . import bench, common, compare, demo, doctor, instrument, report, serve

__all__ = ["COMMANDS", "build_parser", "main"]

#: In the order ``servescope --help`` lists them.
COMMANDS: list[common.Command] = [doctor, bench, serve, instrument, report, compare, demo]  # type: ignore[list-item]


def build_parser() -> argparse.ArgumentParser:
    parser = common.Parser(prog="servescope", description="Where an inference endpoint's time goes, and why.")
    parser.add_argument("--version", action="version", version=f"servescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=common.Parser)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP, epilog=getattr(command, "EPILOG", None))
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    # a pipe gets a fixed, readable width instead of rich's 80-column fallback
    console = Console() if sys.stdout.isatty() else Console(width=120)
    try:
        return int(args.run(args, console))
    except ServescopeError as exc:
        sys.stderr.write(f"servescope: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("servescope: interrupted\n")
        return 130
