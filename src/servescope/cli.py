"""The command line: parse arguments, build library objects, render. No logic lives here."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, Sequence

from rich.console import Console

from . import __version__
from .exceptions import ConfigError, ServescopeError


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


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = _positive_int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _duration(text: str) -> float:
    from .bench import parse_duration

    try:
        value = parse_duration(text)
    except ServescopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 1,2,4, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return values


def _rate_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected requests/s like 100 or 50,100,200, got {text!r}") from None
    if any(not v > 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"a rate must be > 0 requests/s, got {text!r}")
    return values


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="servescope", description="Where an inference endpoint's time goes, and why.")
    parser.add_argument("--version", action="version", version=f"servescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="a slow embedding endpoint on a real model: diagnosed, fixed, measured before and after")
    demo.add_argument("--seconds", type=_duration, default=8.0, help="measured load per service (default 8s)")
    demo.add_argument("--warmup", type=_duration, default=2.0, help="warm-up load per service (default 2s)")
    demo.add_argument("--concurrency", type=_positive_int, default=8, help="concurrent clients (default 8)")
    demo.add_argument("--out", default="servescope-demo", help="folder for the JSON and HTML reports (default servescope-demo/)")

    cmp_ = sub.add_parser("compare", help="before/after table for two saved reports")
    cmp_.add_argument("before", help="a report saved with --json")
    cmp_.add_argument("after", help="a report saved with --json")
    cmp_.add_argument("--html", metavar="FILE", help="also write the comparison as HTML")

    bench = sub.add_parser("bench", help="load-test an HTTP endpoint; per-stage latency from its Server-Timing")
    bench.add_argument("url", help="the endpoint, e.g. http://127.0.0.1:8000/predict")
    bench.add_argument("-X", "--method", default=None, help="HTTP method (default GET, or POST with a body)")
    bench.add_argument("--body", metavar="FILE", action="append", default=[], help="request body from a file; repeat to cycle several")
    bench.add_argument("-H", "--header", action="append", default=[], type=_header, help="'Name: value', repeatable")
    bench.add_argument("--content-type", help="Content-Type of the body (default: JSON when the body parses as JSON)")
    bench.add_argument("-c", "--concurrency", type=_int_list, help="closed loop: requests in flight; a list (1,2,4,8) sweeps")
    bench.add_argument("-r", "--rate", type=_rate_list, help="open loop: requests/s on a fixed schedule; a list sweeps")
    bench.add_argument("--poisson", action="store_true", help="open loop with Poisson (random) arrivals")
    bench.add_argument("-d", "--duration", type=_duration, default=10.0, help="measured time per level (default 10s)")
    bench.add_argument("-n", "--requests", type=_positive_int, help="measured requests per level, instead of --duration")
    bench.add_argument("--warmup", type=_duration, default=1.0, help="load before measuring, excluded (default 1s)")
    bench.add_argument("--timeout", type=_duration, default=30.0, help="per-request timeout (default 30s)")
    bench.add_argument("--max-connections", type=_positive_int, default=1024, help="open loop: connection cap")
    bench.add_argument("--seed", type=int, help="seed for --poisson arrivals")
    bench.add_argument("--ray", metavar="ADDRESS", help="run the load generators on a Ray cluster: auto, HOST:PORT, ray://HOST:PORT, or local")
    bench.add_argument("--generators", type=_positive_int, default=None, help="with --ray: load generators (actors, one CPU each; default 2)")
    bench.add_argument("--json", metavar="FILE", help="write the report (JSON)")
    bench.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")

    doc = sub.add_parser(
        "doctor",
        help="name the causes of a slow endpoint, with evidence and the fix",
        epilog="exit status: 0 diagnosed, 1 a finding at --fail-on or worse, 2 bad arguments, 3 could not diagnose "
        "(the requests failed, hung or ended the process)",
    )
    doc.add_argument("target", nargs="?", help="path/to/file.py:name or package.module:name (a handler, a FastAPI/Starlette or Flask app)")
    doc.add_argument("--url", help="an endpoint already running: only the checks that work from outside")
    doc.add_argument("--payload", metavar="FILE", help="a JSON request body (for a handler: its argument)")
    doc.add_argument("--path", default="/predict", help="the route to POST to, for apps (default /predict)")
    doc.add_argument("--requests", type=_at_least(3), default=30, help="sequential warm requests (default 30, at least 3)")
    doc.add_argument("--concurrency", type=_positive_int, default=8, help="callers in the concurrent phase (default 8)")
    doc.add_argument("--timeout", type=_duration, default=30.0, help="per-request timeout (default 30s)")
    doc.add_argument("--fail-on", choices=["critical", "high", "medium", "low", "info"], help="exit 1 when a finding this bad or worse is present (3 when it could not diagnose, always)")
    doc.add_argument("--json", metavar="FILE", help="write the report (JSON)")
    doc.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")

    srv = sub.add_parser("serve", help="serve a servescope.Model with batching, warm-up and Server-Timing")
    srv.add_argument("target", help="path/to/file.py:ModelClass (or an instance, or a serve() app)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_port, default=8000)
    srv.add_argument("--max-batch-size", type=_positive_int, default=None, help="largest batch (default 8)")
    srv.add_argument("--max-wait-ms", type=float, default=None, help="extra wait for a batch to fill (default 0)")
    srv.add_argument("--max-queue", type=_positive_int, default=None, help="queued requests before 503 (default 256)")
    srv.add_argument("--timeout", type=_duration, default=None, help="per-request deadline, 504 after (default 30s)")
    srv.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the best available)")
    srv.add_argument("--threads", type=_positive_int, default=None, help="torch intra-op threads (default: the CPUs available)")
    srv.add_argument("--debug-errors", action="store_true", default=None, help="put exception text in error bodies (default: the log only)")
    srv.add_argument("--ray", action="store_true", help="deploy on Ray Serve (Ray's HTTP proxy on --host/--port)")
    srv.add_argument("--replicas", type=_positive_int, default=None, help="with --ray: replicas (default 1)")
    srv.add_argument("--ray-address", default=None, help="with --ray: the cluster (auto, HOST:PORT, ray://HOST:PORT; default: start one here)")

    report = sub.add_parser("report", help="print a saved report (JSON) again")
    report.add_argument("file", help="a report saved with --json, or a running server's http://HOST:PORT/report")
    report.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    return parser


def _demo(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from .demo import run_demo
    from .renderers.compare import render_compare
    from .renderers.html import render_comparison_html
    from .renderers.terminal import render_terminal

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


def _compare(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from .compare import compare
    from .renderers.compare import render_compare
    from .renderers.html import render_comparison_html
    from .report import Report

    before, after = Report.load(args.before), Report.load(args.after)
    table = compare(before, after)
    render_compare(table, console=console)
    if args.html:
        Path(args.html).write_text(render_comparison_html(before, after, table))
        console.print(f"HTML saved to {args.html}")
    return 0


#: The doctor sends the payload dozens of times, concurrently: a bigger one is not representative.
MAX_PAYLOAD_BYTES = 32 * 1024 * 1024


def _doctor(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    import orjson

    from .doctor import DoctorOptions

    if not args.payload:
        raise ConfigError("give --payload FILE: the JSON body to send (a handler gets it parsed)")
    try:
        size = Path(args.payload).stat().st_size
        if size > MAX_PAYLOAD_BYTES:
            raise ConfigError(
                f"payload file {args.payload!r} is {size / 2**20:.0f} MB: the doctor sends it dozens of times, "
                f"so give a representative request of at most {MAX_PAYLOAD_BYTES // 2**20} MB"
            )
        payload = orjson.loads(Path(args.payload).read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read payload file {args.payload!r}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"payload file {args.payload!r} is not valid JSON: {exc}") from None
    if (args.target is None) == (args.url is None):
        raise ConfigError("give a TARGET (path/to/file.py:name) or --url URL, not both")
    options = DoctorOptions(
        path=args.path,
        requests=args.requests,
        concurrency=args.concurrency,
        concurrent_requests=max(args.concurrency * 6, 24),
        timeout_s=args.timeout,
    )
    if args.url:
        from .doctor import diagnose_url

        with console.status(f"servescope doctor --url {args.url}"):
            report = diagnose_url(args.url, payload=payload, options=options)
        return _finish_doctor(report, args, console)
    from .doctor.isolate import diagnose_isolated
    from .loader import check_target_spec

    check_target_spec(args.target)
    with console.status("servescope doctor: starting") as status:
        report = diagnose_isolated(
            args.target,
            payload_path=args.payload,
            options=options,
            progress=lambda phase, frac: status.update(f"servescope doctor: {phase}"),
        )
    return _finish_doctor(report, args, console)


def _finish_doctor(report: Any, args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from .doctor import EXIT_DIAGNOSED, EXIT_FINDINGS, EXIT_UNDIAGNOSED
    from .renderers.html import render_html
    from .renderers.terminal import render_terminal
    from .report import SEVERITIES

    render_terminal(report, console=console)
    if args.json:
        report.save(args.json)
        console.print(f"Report saved to {args.json}")
    if args.html:
        Path(args.html).write_text(render_html(report))
        console.print(f"HTML report saved to {args.html}")
    if not (report.extra.get("verdict") or {}).get("diagnosed", True):
        return EXIT_UNDIAGNOSED
    if args.fail_on:
        worst = SEVERITIES.index(args.fail_on)
        if any(SEVERITIES.index(f.severity) <= worst for f in report.findings):
            return EXIT_FINDINGS
    return EXIT_DIAGNOSED


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from .loader import load_target
    from .serve import Model, ServeApp, serve

    obj = load_target(args.target)
    options = {
        k: v
        for k, v in {
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "max_queue": args.max_queue,
            "timeout_s": args.timeout,
            "device": args.device,
            "threads": args.threads,
            "debug_errors": args.debug_errors,
        }.items()
        if v is not None
    }
    if isinstance(obj, type) and issubclass(obj, Model):
        obj = obj()
    if isinstance(obj, Model):
        app = serve(obj, **options)
    elif isinstance(obj, ServeApp):
        if options:
            raise ConfigError(f"{args.target} is already a serve() app: set its options in the file, not here")
        app = obj
    else:
        raise ConfigError(f"{args.target} is {type(obj).__name__}, not a servescope.Model subclass or a serve() app")
    if not args.ray and (args.replicas is not None or args.ray_address is not None):
        raise ConfigError("--replicas and --ray-address go with --ray")
    if args.ray:
        from .serve.ray_serve import run

        if not isinstance(obj, Model):
            raise ConfigError("--ray deploys a servescope.Model (each replica builds its own app): point at the Model class")
        run(obj, replicas=args.replicas or 1, host=args.host, port=args.port, address=args.ray_address, **options)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("servescope").setLevel(logging.INFO)
    sys.stderr.write(f"servescope: serving {args.target} on http://{args.host}:{args.port} (loading...)\n")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=30)
    return 0


def _bench(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    import orjson

    from .bench import BenchOptions, run_bench, sweep_summary
    from .renderers.html import render_html
    from .renderers.progress import BenchProgress
    from .renderers.sweep import render_sweep
    from .renderers.terminal import render_terminal

    bodies = []
    for name in args.body:
        try:
            bodies.append(Path(name).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read body file {name!r}: {exc.strerror or exc}") from None
    content_type = args.content_type
    if bodies and content_type is None:
        try:
            orjson.loads(bodies[0])
            content_type = "application/json"
        except orjson.JSONDecodeError:
            content_type = "application/octet-stream"
    options = BenchOptions(
        url=args.url,
        method=args.method or ("POST" if bodies else "GET"),
        bodies=bodies,
        headers=args.header,
        content_type=content_type,
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
        raise ConfigError("--generators goes with --ray ADDRESS")
    with BenchProgress(console, seconds=args.warmup + args.duration if not args.requests else None, requests=args.requests) as progress:
        if args.ray:
            from .cluster import run_bench_ray

            reports = run_bench_ray(
                options, address=args.ray, generators=args.generators or 2, say=console.print, on_progress=progress.show
            )
        else:
            reports = run_bench(options, on_tick=progress.tick)
    if not reports:
        console.print("No load level completed.")
        return 1
    final = reports[-1]
    rows = sweep_summary(reports)
    if len(reports) > 1:
        render_sweep(rows, console=console)
        final.extra["sweep"] = rows
        final.extra["levels"] = [r.to_dict(distributions=False, samples=False) for r in reports]
    render_terminal(final, console=console)
    if final.meta.get("interrupted"):
        console.print("[yellow]Interrupted: the report covers what ran.[/]")
    if args.json:
        final.save(args.json)
        console.print(f"Report saved to {args.json}")
    if args.html:
        Path(args.html).write_text(render_html(final, sweep=rows))
        console.print(f"HTML report saved to {args.html}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # a pipe gets a fixed, readable width instead of rich's 80-column fallback
    console = Console() if sys.stdout.isatty() else Console(width=120)
    try:
        if args.command == "demo":
            return _demo(args, console)
        elif args.command == "compare":
            return _compare(args, console)
        elif args.command == "doctor":
            return _doctor(args, console)
        elif args.command == "serve":
            return _serve(args)
        elif args.command == "bench":
            return _bench(args, console)
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
