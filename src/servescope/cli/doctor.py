"""``servescope doctor TARGET``: name the causes of a slow endpoint, with evidence and the fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from . import common
from .common import positive_int

#: (as doctor/send.py's, without importing the doctor for --help)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

NAME = "doctor"
HELP = "name the causes of a slow endpoint, with evidence and the fix"
EPILOG = (
    "exit status: 0 diagnosed, 1 a finding at --fail-on or worse, 2 bad arguments, 3 could not diagnose "
    "(the requests failed, hung or ended the process)"
)


def pid_list(text: str) -> list[int]:
    """``123`` or ``123,456``: process ids."""
    try:
        pids = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id (or a comma-separated list of them): {text!r}") from None
    if not pids or any(p <= 0 for p in pids):
        raise argparse.ArgumentTypeError(f"process ids are whole numbers above 0, got {text!r}")
    return pids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", help="path/to/file.py:name or package.module:name (a handler, a FastAPI/Starlette or Flask app, a servescope.Model)")
    parser.add_argument("--url", help="an endpoint already running: only the checks that work from outside (with --pid: the doctor's requests go there while it samples)")
    parser.add_argument(
        "--pid", type=pid_list, metavar="PID[,PID...]",
        help="a server already running (its master process for gunicorn/uvicorn workers; several PIDs for Ray Serve replicas "
        "or workers that are not its children): sample its stacks with py-spy, without stopping or changing it; with --url "
        "the doctor also sends its requests, else it reads the server's own traffic",
    )  # fmt: skip
    parser.add_argument("--duration", metavar="DURATION", type=common.duration, default=30.0, help="with --pid and no --url: how long to sample the server's own traffic (default 30s)")
    parser.add_argument("--rate", metavar="HZ", type=positive_int, default=100, help="with --pid: samples per second (default 100)")
    parser.add_argument("--flames", metavar="DIR", help="with --pid: write the samples as flame graphs by stage into DIR (speedscope JSON and collapsed stacks)")
    common.add_body(parser, many=False, old="--payload")
    common.add_file(parser)
    parser.add_argument("--path", default="/predict", help="the route to send to, with a query string for a GET (/search?q=cat), for apps (default /predict)")
    parser.add_argument(
        "-X", "--method", type=str.upper, choices=METHODS, metavar="METHOD",
        help="the HTTP method for an app (default: the route's own; POST or GET as there is a body when it takes several)",
    )  # fmt: skip
    common.add_requests(parser, default=30, low=3, what="sequential warm requests (default 30, at least 3)")
    parser.add_argument("-c", "--concurrency", metavar="N", type=positive_int, default=8, help="requests in flight in the concurrent phase (default 8)")
    common.add_timeout(parser, default=30.0)
    parser.add_argument(
        "--experiments", metavar="DURATION", type=common.duration, default=30.0,
        help="time for trying each fix the doctor can apply in-process on the endpoint before it names the saving "
        "(default 30s; 0: none, every saving is then an estimate)",
    )  # fmt: skip
    common.add_fail_on(parser)
    common.add_outputs(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from ..doctor import DoctorOptions, exit_status
    from ..exceptions import ConfigError
    from ..payload import MAX_DOCTOR_BYTES, read_json
    from ..renderers.terminal import render_terminal

    if args.pid is not None and args.target is not None:
        raise ConfigError("--pid diagnoses a running server: give it without a TARGET (the doctor runs TARGET itself)")
    if args.pid is None and (args.target is None) == (args.url is None):
        raise ConfigError("give a TARGET (path/to/file.py:name), --url URL or --pid PID")
    if args.pid is None and (args.flames or args.rate != 100):
        raise ConfigError("--flames and --rate go with --pid")
    if args.duration != 30.0 and (args.pid is None or args.url):
        raise ConfigError("--duration is how long --pid samples the server's own traffic: it does not go with --url, and needs --pid")
    if args.body and args.file:
        raise ConfigError("--file sends a form upload as the body: it does not go with --body")
    if args.method == "GET" and (args.body or args.file):
        raise ConfigError("GET with a body: a GET carries its input in the query string (--path '/route?x=1'); drop --body/--file")
    payload = read_json(args.body, max_bytes=MAX_DOCTOR_BYTES, why="the doctor sends it dozens of times, concurrently") if args.body else None
    files = tuple((f, str(Path(p).resolve())) for f, p in args.file)  # (the child runs elsewhere)
    options = DoctorOptions(
        path=args.path, method=args.method, files=files, requests=args.requests, concurrency=args.concurrency,
        timeout_s=args.timeout, experiment_seconds=args.experiments,
    )  # fmt: skip
    options.upload()  # (an unreadable or too big file: said now, before anything runs)
    out = common.table_console(args, console)
    if args.pid is not None:
        from ..doctor.live import AttachError, LiveOptions, diagnose_pid

        first, *more = args.pid
        live = LiveOptions(first, url=args.url, duration_s=args.duration, rate=args.rate, flames=args.flames, more=tuple(more))
        try:
            with out.status(f"servescope doctor --pid {','.join(map(str, args.pid))}") as status:
                report = diagnose_pid(live, payload=payload, options=options, progress=lambda phase: status.update(f"servescope doctor: {phase}"))
        except AttachError as exc:
            sys.stderr.write(f"servescope: {exc}\n")  # (the target was not touched)
            return 3
    elif args.url:
        from ..doctor import diagnose_url

        with out.status(f"servescope doctor --url {args.url}"):
            report = diagnose_url(args.url, payload=payload, options=options)
    else:
        from ..doctor.isolate import diagnose_isolated
        from ..loader import check_target_spec

        check_target_spec(args.target)
        with out.status("servescope doctor: starting") as status:
            report = diagnose_isolated(
                args.target,
                payload_path=args.body,
                options=options,
                progress=lambda phase, frac: status.update(f"servescope doctor: {phase}"),
            )
    render_terminal(report, console=out)
    common.write_outputs(report, args, out)
    return exit_status(report, args.fail_on)
