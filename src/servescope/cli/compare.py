"""``servescope compare``: before/after table of two saved reports, with a noise test."""

from __future__ import annotations

import argparse

from rich.console import Console

NAME = "compare"
HELP = "before/after table for two saved reports"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", help="a report saved with --json")
    parser.add_argument("after", help="a report saved with --json")
    parser.add_argument("--html", metavar="FILE", help="also write the comparison as HTML")


def run(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from ..compare import compare
    from ..renderers.compare import render_compare
    from ..renderers.html import render_comparison_html
    from ..report import Report

    before, after = Report.load(args.before), Report.load(args.after)
    table = compare(before, after)
    render_compare(table, console=console)
    if args.html:
        Path(args.html).write_text(render_comparison_html(before, after, table))
        console.print(f"HTML saved to {args.html}")
    return 0
