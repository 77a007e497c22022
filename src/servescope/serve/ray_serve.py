"""The runtime on Ray Serve: the same ``servescope.Model`` as N replicas, Ray doing placement,
routing and replica health.

    from ray import serve
    from servescope.serve.ray_serve import deployment

    app = deployment(Embedder(), replicas=4, max_batch_size=32)   # a Ray Serve Application
    serve.run(app, route_prefix="/")

or ``servescope serve file.py:Embedder --ray --replicas 4``.

Each replica is a whole ``ServeApp``: it loads and warms up in its constructor (Ray routes to
a replica only once that returns), batches, times its stages and answers ``Server-Timing``
with two entries more: ``replica;desc=<id>`` and ``upstream;desc="ray serve proxy"``. The
second tells a client that the time it saw beyond ``total`` is Ray's proxy and router plus the
network (``servescope bench`` names that gap ``proxy+network``).

Every replica ships what it recorded since its last shipment to one collector actor per
application, every ``push_every_s``; ``GET /report`` on any replica (or ``report(app)``)
merges every replica's distributions, never averaging percentiles. A replica that dies keeps
what it shipped.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from ..load.cluster import connect, node_name
from ..exceptions import ConfigError, EndpointError, require
from ..recorder import Recorder
from ..report import Report
from .app import ServeApp
from .model import Model

__all__ = ["deploy", "deployment", "report", "run", "shutdown"]

log = logging.getLogger("servescope")

#: The namespace of the collector actors (one per application, detached).
NAMESPACE = "servescope"
#: The Server-Timing entry a replica adds: the client's gap over ``total`` crosses Ray's proxy.
UPSTREAM = 'upstream;desc="ray serve proxy"'


def collector_name(app_name: str) -> str:
    return f"servescope-stats:{app_name}"


class StatsCollector:
    """Holds every replica's figures, merged as they arrive (a Ray actor, one per application)."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self.replicas: dict[str, dict[str, Any]] = {}

    def push(self, replica: str, node: str, delta: dict[str, Any] | None) -> int:
        entry = self.replicas.setdefault(replica, {"node": node, "report": None, "pushes": 0})
        entry["last_push"] = time.time()
        entry["pushes"] += 1
        if delta is not None:
            part = Report.from_dict(delta)
            if entry["report"] is None:
                entry["report"] = part
            else:
                merged = Report.combine([entry["report"], part])
                merged.meta = entry["report"].meta
                entry["report"] = merged
        return len(self.replicas)

    def report(self) -> dict[str, Any] | None:
        now = time.time()
        rows = [
            {
                "replica": rid,
                "node": e["node"],
                "requests": 0 if e["report"] is None else e["report"].latency["count"] + sum(e["report"].errors.values()),
                "last_push_s_ago": round(now - e["last_push"], 2),
            }
            for rid, e in sorted(self.replicas.items())
        ]
        reports = [e["report"] for e in self.replicas.values() if e["report"] is not None]
        if not reports:
            return None
        merged = Report.combine(reports, tool="servescope serve on Ray", app=self.app_name, replicas=rows)
        return merged.to_dict(samples=False)


def _collector(app_name: str) -> Any:
    import ray

    actor = ray.remote(num_cpus=0)(StatsCollector)
    return actor.options(
        name=collector_name(app_name), namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(app_name)


def report(app_name: str = "servescope", *, timeout_s: float = 30.0) -> Report:
    """The merged Report of every replica of a deployed application (call where Ray is connected)."""
    import ray

    try:
        actor = ray.get_actor(collector_name(app_name), namespace=NAMESPACE)
    except ValueError:
        raise EndpointError(f"no servescope application {app_name!r} on this Ray cluster") from None
    data = ray.get(actor.report.remote(), timeout=timeout_s)
    if data is None:
        raise EndpointError(f"application {app_name!r} has served no request yet")
    return Report.from_dict(data)


# -- the replica ------------------------------------------------------------------------------
_APP: ServeApp | None = None  # this replica process's app, handed to Ray's ASGI wrapper


def _this_replica_app() -> ServeApp:
    assert _APP is not None, "the replica's constructor builds the app first"
    return _APP


class ServescopeReplica:
    """One replica: a ServeApp loaded and warmed up in the constructor, shipping its figures."""

    def __init__(self, model: Model, options: dict[str, Any], push_every_s: float = 1.0) -> None:
        global _APP
        from ray import serve

        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id
        self.app_name = ctx.app_name
        self.node = node_name()
        self.recorder = Recorder(deltas=True, keep_samples=0)
        self.collector = _collector(self.app_name)
        self._push_lock = threading.Lock()
        self._held: Report | None = None  # a shipment that failed, sent again with the next
        self.serve_app = ServeApp(
            model,
            **options,
            recorder=self.recorder,
            report_source=self.merged_report,
            timing_suffix=f', replica;desc="{self.replica_id}", {UPSTREAM}',
        )
        if self.serve_app.load_now() != "ready":
            raise RuntimeError(f"servescope replica {self.replica_id} failed to start: {self.serve_app.failure}")
        _APP = self.serve_app
        self.push_every_s = push_every_s
        self._stop = threading.Event()
        self.push()  # registered with the collector before the first request
        threading.Thread(target=self._pusher, name="servescope-push", daemon=True).start()

    def push(self) -> None:
        """Ship what was recorded since the last push; a shipment that fails is kept and goes
        with the next one (deltas are disjoint, so nothing is counted twice or lost)."""
        import ray

        with self._push_lock:
            delta = self.recorder.take_delta(replica=self.replica_id)
            held, self._held = self._held, None
            if held is not None:
                delta = held if delta is None else Report.combine([held, delta])
            data = None if delta is None else delta.to_dict(samples=False)
            try:
                ray.get(self.collector.push.remote(self.replica_id, self.node, data), timeout=30)
            except BaseException:
                self._held = delta
                raise

    def _pusher(self) -> None:
        while not self._stop.wait(self.push_every_s):
            try:
                self.push()
            except Exception as exc:  # the collector restarting: the next push carries on
                log.warning("servescope: replica %s could not ship its figures: %s", self.replica_id, exc)

    def merged_report(self) -> Report:
        """Every replica's figures: this one's freshest, the others' as of their last push."""
        import ray

        self.push()
        data = ray.get(self.collector.report.remote(), timeout=30)
        return Report.from_dict(data) if data is not None else self.recorder.report(tool="servescope serve on Ray")

    def check_health(self) -> None:  # Ray calls it periodically; raising restarts the replica
        if self.serve_app.state == "failed":
            raise RuntimeError(f"servescope replica failed: {self.serve_app.failure}")

    def __del__(self) -> None:  # Ray's graceful shutdown: ship what is left
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            try:
                self.push()
            except Exception:
                pass


def deployment(
    model: Model,
    *,
    replicas: int = 1,
    name: str = "servescope",
    ray_actor_options: dict[str, Any] | None = None,
    max_ongoing_requests: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    push_every_s: float = 1.0,
    **options: Any,
) -> Any:
    """A Ray Serve Application serving ``model`` on ``replicas`` replicas (or as many as Ray's
    ``autoscaling_config`` decides); ``options`` as ``servescope.serve`` (validated here,
    before anything is sent to the cluster).

    Each replica asks Ray for ``ray_actor_options`` (default one CPU) and uses that many torch
    threads unless ``threads`` is given. ``max_ongoing_requests`` (Ray's cap on what one
    replica holds at once) defaults to twice the batch size plus 8, so batches can fill.
    """
    require("ray.serve", "ray", "to deploy on Ray Serve")
    from ray import serve

    if not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas must be a whole number >= 1, got {replicas!r}")
    ServeApp(model, **options)  # validates the options here, with the user's traceback
    actor = {"num_cpus": 1, **(ray_actor_options or {})}
    options.setdefault("threads", max(1, int(actor["num_cpus"] or 1)))
    batch = options.get("max_batch_size", 8)
    ongoing = max_ongoing_requests or 2 * batch + 8
    _ship_by_value(type(model).__module__)
    replica_cls = serve.ingress(_this_replica_app)(ServescopeReplica)
    scale: dict[str, Any] = {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": replicas}
    dep = serve.deployment(replica_cls, name=name, ray_actor_options=actor, max_ongoing_requests=ongoing, **scale)
    return dep.bind(model, options, push_every_s)


def _ship_by_value(module_name: str) -> None:
    """A model class from a file loaded by path (``servescope serve file.py:Model``) is not
    importable on Ray's workers: send its module's code along with the model."""
    import sys

    from ..loader import FILE_MODULE_PREFIX

    module = sys.modules.get(module_name)
    if module is not None and module_name.startswith(FILE_MODULE_PREFIX):
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)


def deploy(model: Model, *, replicas: int = 1, app_name: str = "servescope", route_prefix: str = "/", **options: Any) -> None:
    """``serve.run`` of ``deployment(...)`` on the connected cluster, waiting until every replica
    is warm; a replica that cannot start is a ``ConfigError`` with its reason."""
    from ray import serve

    app = deployment(model, replicas=replicas, name=app_name, **options)
    try:
        serve.run(app, name=app_name, route_prefix=route_prefix)
    except RuntimeError as exc:
        why = _failure(app_name)
        shutdown(app_name)
        raise EndpointError(f"deploying {app_name!r} on Ray Serve failed: {why or exc}") from None


def _failure(app_name: str) -> str | None:
    """The replicas' own reason for failing, from Serve's status (None if it has none)."""
    from ray import serve

    try:
        app = serve.status().applications[app_name]
    except (KeyError, AttributeError):
        return None
    for dep in app.deployments.values():
        found = re.findall(r"RuntimeError: (servescope replica .*)", dep.message or "")
        if found:
            return found[-1].strip()
    return app.message or None


def run(
    model: Model,
    *,
    replicas: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    app_name: str = "servescope",
    wait: bool = True,
    **options: Any,
) -> str:
    """Deploy ``model`` on Ray Serve behind Ray's HTTP proxy at ``host:port``; with ``wait``,
    block until Ctrl-C or SIGTERM, then take the application down. Returns the base URL."""
    deployment(model, replicas=replicas, name=app_name, **options)  # bad options: refused before Ray starts
    started = connect(address)
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    try:
        deploy(model, replicas=replicas, app_name=app_name, **options)
    except BaseException:
        if started:
            serve.shutdown()
            import ray

            ray.shutdown()
        raise
    url = f"http://{host}:{port}"
    if not _answers(f"{url}/health"):  # Serve was already up on this cluster, with its own HTTP options
        log.warning("servescope: deployed, but nothing answers on %s: Ray Serve was already running on this "
                    "cluster and keeps its own HTTP host and port (see `serve status`)", url)  # fmt: skip
    if not wait:
        return url
    import signal

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"servescope: {replicas} replica(s) ready on Ray Serve at {url}/predict (merged figures: {url}/report)", flush=True)
    stop.wait()
    shutdown(app_name, local=started)
    return url


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def shutdown(app_name: str = "servescope", *, local: bool = False) -> None:
    """Delete the application and its collector; stop Ray too if this process started it."""
    import ray
    from ray import serve

    serve.delete(app_name)
    try:
        ray.kill(ray.get_actor(collector_name(app_name), namespace=NAMESPACE))
    except ValueError:
        pass
    if local:
        serve.shutdown()
        ray.shutdown()
