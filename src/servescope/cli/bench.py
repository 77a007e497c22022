"""``servescope bench URL``: load an endpoint; per-stage latency from its Server-Timing."""

from __future__ import annotations

import argparse

from rich.console import Console

from . import common
from .common import duration, int_list, positive_int, rate_list

NAME = "bench"
HELP = "load-test an HTTP endpoint; per-stage latency from its Server-Timing"
EPILOG = "exit status: 0 measured, 2 bad arguments or an endpoint out of reach, 3 most requests of a level failed (or none completed): the run did not measure the endpoint"
#: Most requests of a level failed, or no level completed.
EXIT_NOT_MEASURED = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the endpoint, e.g. http://127.0.0.1:8000/predict")
    parser.add_argument("-X", "--method", default=None, help="HTTP method (default GET, or POST with a body)")
    common.add_body(parser, many=True)
    parser.add_argument("-H", "--header", metavar="'NAME: VALUE'", action="append", default=[], type=common.header, help="'Name: value', repeatable")
    parser.add_argument("--content-type", metavar="TYPE", help="Content-Type of the body (default: JSON when the body parses as JSON)")
    parser.add_argument("-c", "--concurrency", metavar="N[,N...]", type=int_list, help="closed loop: requests in flight; a list (1,2,4,8) sweeps")
    parser.add_argument("-r", "--rate", metavar="R[,R...]", type=rate_list, help="open loop: requests/s on a fixed schedule; a list sweeps")
    parser.add_argument("--poisson", action="store_true", help="open loop with Poisson (random) arrivals")
    parser.add_argument("-d", "--duration", metavar="DURATION", type=duration, default=10.0, help="measured time per level (default 10s)")
    common.add_requests(parser, default=None, low=1, what="measured requests per level, instead of --duration")
    parser.add_argument("--warmup", metavar="DURATION", type=duration, default=1.0, help="load before measuring, excluded (default 1s)")
    common.add_timeout(parser, default=30.0)
    parser.add_argument("--max-connections", metavar="N", type=positive_int, default=1024, help="open loop: connection cap (default 1024)")
    parser.add_argument("--seed", metavar="N", type=int, help="seed for --poisson arrivals")
    common.add_ray(parser, "run the load generators on a Ray cluster")
    parser.add_argument("--generators", metavar="N", type=positive_int, default=None, help="with --ray: load generators (actors, one CPU each; default 2)")
    common.add_outputs(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.text import Text

    from ..bench import BenchOptions, failed_levels, run_bench
    from ..sweep import sweep_report, sweep_summary
    from ..exceptions import ConfigError
    from ..payload import content_type_of, read_body
    from ..renderers.progress import BenchProgress
    from ..renderers.sweep import render_sweep
    from ..renderers.terminal import render_terminal

    bodies = [read_body(name) for name in args.body]
    options = BenchOptions(
        url=args.url,
        method=args.method or ("POST" if bodies else "GET"),
        bodies=bodies,
        headers=args.header,
        content_type=args.content_type or (content_type_of(bodies[0]) if bodies else None),
        concurrency=args.concurrency or [],
        rate=args.rate or [],
        poisson=args.poisson,
        duration_s=args.duration,
        requests=args.requests,
        warmup_s=args.warmup,
        timeout_s=args.timeout,
        max_connections=args.max_connections,
        seed=args.seed,
    )
    if args.generators is not None and not args.ray:
        raise ConfigError("--generators goes with --ray")
    out = common.table_console(args, console)
    seconds = args.warmup + args.duration if not args.requests else None
    with BenchProgress(out, seconds=seconds, requests=args.requests) as progress:
        if args.ray:
            from ..cluster import run_bench_ray

            reports = run_bench_ray(options, address=args.ray, generators=args.generators or 2, say=out.print, on_progress=progress.show)
        else:
            reports = run_bench(options, on_tick=progress.tick)
    if not reports:
        out.print("No load level completed.")
        return EXIT_NOT_MEASURED
    failed = failed_levels(reports)
    if failed:  # said first: the figures below are of error answers, not of the endpoint
        out.print(Text(f"Most requests failed, so this run did not measure the endpoint: {failed}", style="bold red"))
    rows = sweep_summary(reports)
    final = sweep_report(reports)
    if len(reports) > 1:
        render_sweep(rows, console=out)
    render_terminal(final, console=out)
    if final.meta.get("interrupted"):
        out.print("[yellow]Interrupted: the report covers what ran.[/]")
    common.write_outputs(final, args, out, sweep=rows)
    return EXIT_NOT_MEASURED if failed else 0
