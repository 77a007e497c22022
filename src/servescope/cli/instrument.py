"""``servescope instrument TARGET``: run an existing ASGI or WSGI app unchanged, with
per-stage Server-Timing on every response (the doctor's probes, for the life of the process:
infer, to_device, validate, serialize, load ...) and the middleware's /metrics."""

from __future__ import annotations

import argparse

from rich.console import Console

from . import common

NAME = "instrument"
HELP = "run your ASGI/WSGI app unchanged, with per-stage Server-Timing on every response"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="path/to/app.py:app or package.module:app (FastAPI, Starlette, Flask ...)")
    common.add_listen(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    import sys

    import uvicorn

    from ..doctor.probes import Probes
    from ..doctor.endpoints import is_asgi
    from ..loader import load_target
    from ..middleware import ServescopeMiddleware, ServescopeWSGIMiddleware
    from ..serve.limits import HttpLimits

    common.check_port_free(args.host, args.port)
    app = load_target(args.target)
    Probes().install()  # for the life of the process
    interface = "auto" if is_asgi(app) else "wsgi"
    middleware = ServescopeWSGIMiddleware if interface == "wsgi" else ServescopeMiddleware
    sys.stderr.write(f"servescope: serving {args.target}, instrumented, on http://{args.host}:{args.port}\n")
    limits = HttpLimits().uvicorn_options()  # the same head and connection limits as servescope serve
    uvicorn.run(middleware(app), host=args.host, port=args.port, log_level="warning", access_log=False, interface=interface, **limits)
    return 0
