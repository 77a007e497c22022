"""``servescope demo``: the slow embedding service, diagnosed, fixed and measured again."""

from __future__ import annotations

import argparse

from rich.console import Console

from .common import duration, positive_int

NAME = "demo"
HELP = "a slow embedding endpoint on a real model: diagnosed, fixed, measured before and after"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", metavar="DURATION", type=duration, default=8.0, help="measured load per service (default 8s)")
    parser.add_argument("--warmup", metavar="DURATION", type=duration, default=2.0, help="warm-up load per service (default 2s)")
    parser.add_argument("-c", "--concurrency", metavar="N", type=positive_int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--out", metavar="DIR", default="servescope-demo", help="folder for the JSON and HTML reports (default servescope-demo/)")


def run(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from ..demo import run_demo
    from ..renderers.compare import render_compare
    from ..renderers.html import render_comparison_html
    from ..renderers.terminal import render_terminal

    with console.status("servescope demo") as status:
        result = run_demo(
            seconds=args.seconds,
            warmup=args.warmup,
            concurrency=args.concurrency,
            say=lambda text: console.print(text),
            progress=lambda text: status.update(text),
        )
    console.print()
    render_terminal(result["doctor"], console=console)
    console.print()
    render_compare(result["table"], console=console, before="before (FastAPI)", after="after (servescope.serve)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("doctor", "before", "after"):
        result[name].save(out / f"{name}.json")
    page = out / "report.html"
    page.write_text(render_comparison_html(result["before"], result["after"], result["table"], doctor=result["doctor"]))
    console.print(f"\nReports: {out}/doctor.json, before.json, after.json; with plots: {page}")
    console.print(f"Compare them again any time: servescope compare {out}/before.json {out}/after.json")
    return 0
