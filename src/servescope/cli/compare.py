"""``servescope compare``: before/after table of two saved reports, with a noise test."""

from __future__ import annotations

import argparse

from rich.console import Console

NAME = "compare"
HELP = "before/after table for two saved reports, each change with its 95% interval"
EPILOG = (
    "exit status: 0 compared, 1 --fail-if-slower and a latency figure slower by more than that, beyond noise, "
    "2 bad arguments, 3 --fail-if-slower and no latency figure could be judged (too few requests)"
)
EXIT_SLOWER, EXIT_CANNOT_TELL = 1, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", help="a report saved with --json")
    parser.add_argument("after", help="a report saved with --json")
    parser.add_argument("--html", metavar="FILE", help="also write the comparison as HTML")
    parser.add_argument(
        "--fail-if-slower", metavar="PCT", type=share, default=None,
        help="exit 1 when a latency figure (p50, p95, p99, mean; TTFT, ITL, TPOT of streamed runs) is slower by more than PCT (10%%) and beyond noise",
    )  # fmt: skip


def share(text: str) -> float:
    """``10%`` (or ``10``) -> 0.10."""
    import argparse

    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 10%, got {text!r}") from None
    if not 0 <= value < 10_000:
        raise argparse.ArgumentTypeError(f"a percentage from 0% up, got {text!r}")
    return value / 100


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
    if args.fail_if_slower is not None:
        if len(table.untold()) == sum(1 for c in table.summary if not c.higher_is_better and c.ratio is not None):
            console.print("--fail-if-slower could not judge any latency figure (see above): failing, not passing blind")
            return EXIT_CANNOT_TELL
        slower = table.slower_than(args.fail_if_slower)
        if slower:
            said = ", ".join(f"{c.metric.removesuffix(' ms')} {c.words} ({c.interval_words})" for c in slower)
            console.print(f"Slower by more than {args.fail_if_slower:.0%} beyond noise: {said}")
            return EXIT_SLOWER
    return 0
