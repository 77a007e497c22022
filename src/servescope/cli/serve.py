"""``servescope serve TARGET``: serve a ``servescope.Model`` with the fixes built in."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from . import common
from .common import duration, positive_int

NAME = "serve"
#: The exit status when the model fails to load or warm up (70: a batch got stuck, see serve/lifecycle.py).
EXIT_START_FAILED = 3
HELP = "serve a servescope.Model with batching, warm-up and Server-Timing"
EPILOG = "exit status: 0 stopped by SIGINT/SIGTERM, 2 bad arguments, 3 the model failed to load or warm up, 70 a batch outlived its deadline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="path/to/file.py:ModelClass (or an instance, or a serve() app)")
    common.add_listen(parser)
    parser.add_argument("--max-batch-size", metavar="N", type=positive_int, default=None, help="largest batch (default 8)")
    parser.add_argument("--max-wait-ms", metavar="MS", type=float, default=None, help="extra wait for a batch to fill (default 0)")
    parser.add_argument("--max-queue", metavar="N", type=positive_int, default=None, help="queued requests before 503 (default 256)")
    parser.add_argument("--timeout", metavar="DURATION", type=duration, default=None, help="per-request deadline, 504 after; for a streamed answer, to its first chunk (default 30s)")
    parser.add_argument("--batch-timeout", metavar="DURATION", type=duration, default=None, help="a batch (or a stream's step) running longer is stuck: the process exits 70 for its supervisor (default: --timeout)")
    parser.add_argument("--max-body-bytes", metavar="N", type=positive_int, default=None, help="largest request body, 413 over it (default 1048576)")
    parser.add_argument("--body-timeout", metavar="DURATION", type=duration, default=None, help="time to receive a request body, 408 after (default 30s)")
    parser.add_argument("--max-header-bytes", metavar="N", type=positive_int, default=None, help="largest request head, 431 over it (default 65536)")
    parser.add_argument("--header-timeout", metavar="DURATION", type=duration, default=None, help="time to receive a request head, 408 after; idle connections close (default 10s)")
    parser.add_argument("--max-connections", metavar="N", type=positive_int, default=None, help="open connections, 503 beyond (default 1000, fewer under a lower open-files limit)")
    parser.add_argument("--device", metavar="DEVICE", default=None, help="cpu, cuda, cuda:1 ... (default: the best available)")
    parser.add_argument("--threads", metavar="N", type=positive_int, default=None, help="torch intra-op threads, kept as given (default: OMP_NUM_THREADS when it is set, else the CPUs available, then adapted while serving to the count forwards run fastest at; said at start-up and in /metrics)")
    parser.add_argument("--lanes", metavar="N", type=positive_int, default=None, help="forwards run at once when a batch has several, sharing the threads (default: 2 for a torch model on 2+ CPUs whose threads servescope picks, else 1; said at start-up and in /metrics)")
    parser.add_argument("--path", metavar="ROUTE", default=None, help="the route the model answers at: the one its clients already call (default /predict)")
    parser.add_argument(
        "-X", "--method", metavar="METHOD", action="append", type=str.upper, choices=("POST", "PUT", "PATCH"), default=None,
        help="the route's method; repeat for several (default POST)",
    )  # fmt: skip
    parser.add_argument("--sse-done", action="store_true", default=None, help="end Server-Sent Events streams with data: [DONE], as OpenAI-style clients expect")
    parser.add_argument("--openai", metavar="NAME", default=None, help="also answer as an OpenAI-compatible server: POST /v1/completions, /v1/chat/completions, GET /v1/models, the model called NAME (docs/serve.md)")
    parser.add_argument("--debug-errors", action="store_true", default=None, help="put exception text in error bodies (default: the log only)")
    parser.add_argument("--workers", metavar="N", type=positive_int, default=1, help="worker processes on one port, each with its own model and CPUs/N threads; one merged /report and /metrics (default 1)")
    common.add_ray(parser, "deploy on Ray Serve (Ray's HTTP proxy on --host/--port)")
    parser.add_argument("--replicas", metavar="N", type=positive_int, default=None, help="with --ray: replicas (default 1)")
    parser.add_argument("--ray-address", dest="ray_address", action=common.Deprecated, new="--ray ADDRESS", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, console: Console) -> int:
    import logging

    from ..exceptions import ConfigError
    from ..loader import load_target
    from ..openmp import prefer_passive_wait
    from ..serve import Routes, ServeApp, as_app, model_of

    if args.ray_address is not None:  # the old spelling: --ray --ray-address ADDRESS
        if args.ray is None:
            raise ConfigError("--ray-address goes with --ray")
        args.ray = args.ray_address
    if args.ray is None and args.replicas is not None:
        raise ConfigError("--replicas goes with --ray")
    if args.ray is None:  # on Ray, the port is its proxy's, which may already be up
        common.check_port_free(args.host, args.port)
    prefer_passive_wait()  # (before the user's file loads torch, and OpenMP with it)
    obj = load_target(args.target)
    options = {
        k: v
        for k, v in {
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "max_queue": args.max_queue,
            "timeout_s": args.timeout,
            "batch_timeout_s": args.batch_timeout,
            "device": args.device,
            "threads": args.threads,
            "lanes": args.lanes,
            "debug_errors": args.debug_errors,
            "max_body_bytes": args.max_body_bytes,
            "body_timeout_s": args.body_timeout,
            "max_header_bytes": args.max_header_bytes,
            "header_timeout_s": args.header_timeout,
            "max_connections": args.max_connections,
            "path": args.path,
            "methods": tuple(args.method) if args.method else None,
            "sse_done": args.sse_done,
            "openai": args.openai,
        }.items()
        if v is not None
    }
    if args.workers > 1:
        if args.ray is not None:
            raise ConfigError("--workers and --ray do not go together: on Ray, use --replicas")
        if isinstance(obj, (ServeApp, Routes)):
            raise ConfigError(f"--workers builds one app per worker from a servescope.Model: {args.target} is already a serve() app")
        from ..serve.workers import run_workers

        sys.stderr.write(f"servescope: serving {args.target} on http://{args.host}:{args.port} with {args.workers} workers (loading...)\n")
        failure = run_workers(args.target, args.workers, host=args.host, port=args.port, on_stuck="exit", **options)
        if failure is not None:
            sys.stderr.write(f"servescope: error: {args.target} could not start: {failure} (the traceback is above)\n")
            return EXIT_START_FAILED
        return 0
    if args.ray is not None:
        from ..serve.ray_serve import run as run_on_ray

        model = model_of(obj)
        if model is None:
            raise ConfigError("--ray deploys a servescope.Model (each replica builds its own app): point at the Model class")
        run_on_ray(model, replicas=args.replicas or 1, host=args.host, port=args.port, address=args.ray, **options)
        return 0
    if not isinstance(obj, (ServeApp, Routes)):
        # a process a supervisor restarts (systemd, Kubernetes, Docker's restart policy): a
        # worker stuck in the model's code ends it, rather than run on beside a stuck thread
        options["on_stuck"] = "exit"
    app = as_app(obj, name=args.target, **options)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("servescope").setLevel(logging.INFO)
    sys.stderr.write(f"servescope: serving {args.target} on http://{args.host}:{args.port} (loading...)\n")
    if app.run(args.host, args.port) == "failed":
        sys.stderr.write(f"servescope: error: {args.target} could not start: {app.failure} (the traceback is above)\n")
        return EXIT_START_FAILED
    return 0
