"""Several models in one app, each at the route its clients already call.

    app = servescope.serve({"/v1/embed": Embedder(), "/v1/rerank": Reranker()}, max_batch_size=16)
    app = servescope.serve({"POST /v1/classify": Classify(), "PUT /v1/keywords": Keywords()})   # methods per route

Each model gets its own runtime (its worker, its batches, its warm-up), exactly as
``serve(model, path=...)`` would make it; the app sends each request to the model of its path
and answers the runtime's own routes for all of them:

    GET /health     200 while the process answers
    GET /ready      200 once every model is ready, 503 before (the body says each one's state)
    GET /metrics    every model's metrics, each sample labelled with its ``route``
    GET /report     every route's requests in one report; ``/report?route=/v1/embed`` one route's
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

import orjson

from ..exceptions import ConfigError
from ..report import Report
from .app import ServeApp
from .asgi import error_body, respond
from .model import Model

__all__ = ["Routes", "label_exposition"]

OWN = ("/health", "/ready", "/metrics", "/report")


class Routes:
    """An ASGI app serving one ``ServeApp`` per route (``serve({path: model, ...})``)."""

    def __init__(self, models: dict[str, Model], **options: Any) -> None:
        if not models:
            raise ConfigError("serve({...}) needs at least one route: {'/predict': MyModel()}")
        if "path" in options:
            raise ConfigError("each model's route is its key in serve({path: model}): no path= beside it")
        if options.get("openai") is not None:
            raise ConfigError("the OpenAI-compatible front serves one model: serve(model, openai='name') on its own")
        self.apps: dict[str, ServeApp] = {}
        for route, model in models.items():
            method, _, path = route.rpartition(" ") if isinstance(route, str) else ("", "", route)
            if not isinstance(path, str) or not path.startswith("/") or path in OWN:
                raise ConfigError(f"each route must start with '/' and not be one of the runtime's own routes {OWN}, got {route!r}")
            if path in self.apps:
                raise ConfigError(f"route {path!r} is given twice")
            methods = {"methods": tuple(m for m in method.replace(",", " ").split() if m)} if method.strip() else {}
            self.apps[path] = ServeApp(model, path=path, **{**options, **methods})
        self.limits = next(iter(self.apps.values())).limits
        self.failure: str | None = None

    @property
    def state(self) -> str:
        states = {app.state for app in self.apps.values()}
        for state in ("failed", "stuck", "starting", "loading", "warming up", "stopping"):
            if state in states:
                return state
        return "ready"

    def report(self, route: str | None = None) -> Report:
        """Every route's requests in one report, or one route's."""
        if route is not None:
            return self.apps[route].report_source()
        reports = [app.report_source() for app in self.apps.values()]
        out = Report.combine(reports) if len(reports) > 1 else reports[0]
        out.meta["routes"] = list(self.apps)
        return out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        path = scope["path"]
        app = self.apps.get(path)
        if app is not None:
            await app(scope, receive, send)
        elif path == "/health":
            await respond(send, 200, orjson.dumps({"status": "alive", "state": self.state}))
        elif path == "/ready":
            states = {p: a.state for p, a in self.apps.items()}
            failures = {p: a.failure for p, a in self.apps.items() if a.failure}
            ok = self.state == "ready"
            body = {"ready": ok, "state": self.state, "routes": states, **({"errors": failures} if failures else {})}
            await respond(send, 200 if ok else 503, orjson.dumps(body))
        elif path == "/metrics":
            await self._metrics(send)
        elif path == "/report":
            route = (parse_qs(scope.get("query_string", b"").decode()).get("route") or [None])[0]
            if route is not None and route not in self.apps:
                await respond(send, 404, error_body(f"no route {route!r}: {', '.join(self.apps)}"))
                return
            body = await asyncio.get_running_loop().run_in_executor(None, lambda: self.report(route).to_json(indent=False, samples=False).encode())
            await respond(send, 200, body)
        else:
            routes = ", ".join(f"{'/'.join(a.methods)} {p}" for p, a in self.apps.items())
            await respond(send, 404, error_body(f"no route {path}: {routes}, GET /health, /ready, /metrics, /report"))

    async def startup(self) -> None:
        """Start every model loading (each in the background, as ``ServeApp.startup``)."""
        for app in self.apps.values():
            await app.startup()

    async def shutdown(self) -> None:
        await asyncio.gather(*(app.shutdown() for app in self.apps.values()))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _metrics(self, send: Any) -> None:
        parts = []
        for path, app in self.apps.items():
            if app.metrics is None:
                await respond(send, 501, error_body("metrics need prometheus-client: pip install 'servescope[prometheus]'"))
                return
            app.metrics.queue_depth.set(app.batcher.depth())
            body, ctype = app.metrics.exposition()
            parts.append((path, body.decode()))
        await respond(send, 200, label_exposition(parts).encode(), [(b"content-type", ctype.encode())])

    async def wait_ready(self, timeout: float = 60.0) -> str:
        await asyncio.gather(*(app.wait_ready(timeout) for app in self.apps.values()))
        return self.state

    def run(self, host: str = "127.0.0.1", port: int = 8000, **uvicorn_options: Any) -> str:
        """Serve on uvicorn until SIGINT/SIGTERM, or until a model fails to start (as ``ServeApp.run``)."""
        import uvicorn

        options = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": 30, **self.limits.uvicorn_options()}
        server = uvicorn.Server(uvicorn.Config(self, host=host, port=port, **{**options, **uvicorn_options}))
        for app in self.apps.values():
            app._server = server  # a model whose start-up fails stops the server
        server.run()
        failed = [f"{p}: {a.failure}" for p, a in self.apps.items() if a.failure]
        self.failure = "; ".join(failed) or None
        return "failed" if failed else self.state


def label_exposition(parts: list[tuple[str, str]]) -> str:
    """Prometheus text from several registries as one: each sample labelled ``route="..."``,
    each family's HELP and TYPE once, its samples from every route together."""
    families: dict[str, list[str]] = {}
    heads: dict[str, list[str]] = {}
    for route, text in parts:
        family = ""
        label = 'route="' + route.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family not in heads:
                    heads[family], families[family] = [], []
                if len(heads[family]) < 2:
                    heads[family].append(line)
            elif line and not line.startswith("#"):
                name, brace, rest = line.partition("{")
                if brace:
                    sample = f"{name}{{{label}," + rest if not rest.startswith("}") else f"{name}{{{label}" + rest
                else:
                    metric, _, value = line.partition(" ")
                    sample = f"{metric}{{{label}}} {value}"
                families.setdefault(family, []).append(sample)
    out = []
    for family, samples in families.items():
        out += heads.get(family, []) + samples
    return "\n".join(out) + "\n"
