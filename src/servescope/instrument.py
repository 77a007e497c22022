"""Run an existing ASGI/WSGI app with the doctor's probes and the middleware, unchanged:
every response carries an automatic per-stage Server-Timing (infer, to_device, validate,
serialize, load ...).

    python -m servescope.instrument path/to/app.py:app --port 8000
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from .exceptions import ServescopeError
    from .loader import load_target
    from .middleware import ServescopeMiddleware, ServescopeWSGIMiddleware
    from .doctor.probes import Probes
    from .doctor.targets import is_asgi

    ap = argparse.ArgumentParser(prog="python -m servescope.instrument")
    ap.add_argument("target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        app = load_target(args.target)
    except ServescopeError as exc:
        sys.stderr.write(f"servescope: error: {exc}\n")
        return 2
    Probes().install()  # for the life of the process
    if is_asgi(app):
        wrapped = ServescopeMiddleware(app, metrics_path=None)
        uvicorn.run(wrapped, host=args.host, port=args.port, log_level="warning", access_log=False)
    else:
        wrapped = ServescopeWSGIMiddleware(app, metrics_path=None)
        uvicorn.run(wrapped, host=args.host, port=args.port, log_level="warning", access_log=False, interface="wsgi")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
