"""The command line: parse arguments, build library objects, render. No logic lives here."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from rich.console import Console

from . import __version__
from .exceptions import ServescopeError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="servescope", description="Where an inference endpoint's time goes, and why.")
    parser.add_argument("--version", action="version", version=f"servescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="time the bundled example endpoint and print its report")
    demo.add_argument("--requests", type=_positive_int, default=300, help="warm requests to send (default 300)")
    demo.add_argument("--cuda", choices=["auto", "events", "sync", "wall"], default="auto", help="GPU timing mode")
    demo.add_argument("--json", metavar="FILE", help="also save the report as JSON")

    report = sub.add_parser("report", help="print a saved report (JSON) again")
    report.add_argument("file", help="a report saved with --json")
    report.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # a pipe gets a fixed, readable width instead of rich's 80-column fallback
    console = Console() if sys.stdout.isatty() else Console(width=120)
    try:
        if args.command == "demo":
            from .demo import run_demo
            from .renderers import render_terminal

            rep = run_demo(requests=args.requests, clock_mode=args.cuda)
            render_terminal(rep, console=console)
            if args.json:
                rep.save(args.json)
                console.print(f"Report saved to {args.json} (re-render: servescope report {args.json})")
        elif args.command == "report":
            from .renderers import render_json, render_terminal
            from .report import Report

            rep = Report.load(args.file)
            if args.json:
                sys.stdout.write(render_json(rep) + "\n")
            else:
                render_terminal(rep, console=console)
        else:
            parser.print_help()
            return 2
    except ServescopeError as exc:
        sys.stderr.write(f"servescope: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("servescope: interrupted\n")
        return 130
    return 0
