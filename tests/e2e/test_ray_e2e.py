"""The runtime on a real local Ray instance: 2 replicas behind Ray Serve's proxy, load from 2
generator actors, merged statistics, and a replica killed mid-load."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from servescope.load.bench import PROXY, BenchOptions
from servescope.cli import main
from servescope.load.cluster import connect, run_bench_ray
from servescope.exceptions import EndpointError
from servescope.loader import load_target
from servescope.serve.ray_serve import deploy, report, shutdown

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
BODY = json.dumps({"x": [0.1] * 256}).encode()


@pytest.fixture(scope="module")
def ray_app():
    import ray
    from ray import serve

    started = connect(None)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    model = load_target(str(ROOT / "examples" / "mlp_serve.py") + ":MLP")  # a file: its code ships by value
    deploy(model(), replicas=2, max_batch_size=8, push_every_s=0.5)
    yield f"http://127.0.0.1:{port}"
    shutdown("servescope")
    serve.shutdown()
    if started:
        ray.shutdown()


def _post(url: str) -> tuple[int, dict, str]:
    req = urllib.request.Request(url + "/predict", data=BODY, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read()), r.headers["server-timing"]


def _options(url: str, **kw) -> BenchOptions:
    return BenchOptions(url=url + "/predict", method="POST", bodies=[BODY], content_type="application/json", warmup_s=0.5, **kw)


def test_replicas_answer_with_their_stages_and_the_proxy_hop_named(ray_app):
    status, body, timing = _post(ray_app)
    assert status == 200 and len(body["logits"]) == 10
    for stage in ("queue", "preprocess", "infer", "serialize", "total"):
        assert f"{stage};dur=" in timing
    assert 'replica;desc="' in timing and "upstream;" in timing


def test_bench_from_two_generators_merges_and_sees_both_replicas(ray_app, tmp_path):
    out = tmp_path / "bench.json"
    code = main(["bench", ray_app + "/predict", "--body", str(_write(tmp_path, BODY)), "-c", "4", "-d", "3s",
                 "--warmup", "0.5s", "--ray", "local", "--generators", "2", "--json", str(out)])  # fmt: skip
    assert code == 0
    rep = json.loads(out.read_text())
    ok = rep["latency"]["count"]
    assert ok > 20 and not rep["errors"]
    gens = rep["load"]["generators"]
    assert len(gens) == 2 and all(g["requests"] > 0 for g in gens)
    # every measured answer named its replica; both replicas served
    replicas = rep["load"]["replicas"]
    assert len(replicas) == 2 and sum(replicas.values()) == ok
    # the gap beyond the replica's total is named as Ray's proxy hop, and the stages add up
    assert PROXY in rep["stages"] and "infer" in rep["stages"]
    mean_sum = sum(s["mean_ms"] for s in rep["stages"].values())
    assert mean_sum == pytest.approx(rep["latency"]["mean_ms"], rel=0.02)

    # the servers' own figures, merged over both replicas, count every request they answered
    time.sleep(1.2)  # one push interval
    merged = report("servescope")
    rows = merged.meta["replicas"]
    assert len(rows) == 2
    assert merged.latency["count"] == sum(r["requests"] for r in rows)
    assert merged.latency["count"] >= ok
    # and GET /report on any replica gives the same merged view
    with urllib.request.urlopen(ray_app + "/report", timeout=30) as r:
        via_http = json.loads(r.read())
    assert via_http["latency"]["count"] >= merged.latency["count"]
    assert set(via_http["stages"]) >= {"queue", "infer", "serialize"}


def test_open_loop_rate_is_split_and_kept(ray_app):
    reps = run_bench_ray(_options(ray_app, rate=[40.0], duration_s=3.0), generators=2)
    rep = reps[0]
    assert rep.extra["throughput_rps"] == pytest.approx(40, rel=0.25)
    assert [g["requests"] for g in rep.extra["generators"]] == pytest.approx([70, 70], abs=8)


def test_a_replica_killed_mid_load_loses_nothing_measured(ray_app):
    import ray

    result: dict = {}
    options = _options(ray_app, concurrency=[2], duration_s=4.0)
    runner = threading.Thread(target=lambda: result.update(reps=run_bench_ray(options, generators=2)))
    runner.start()
    time.sleep(2.5)
    busiest = max(report("servescope").meta["replicas"], key=lambda r: r["requests"])
    served_before = busiest["requests"]
    assert served_before > 0
    ray.kill(ray.get_actor(f"SERVE_REPLICA::servescope#servescope#{busiest['replica']}", namespace="serve"))
    runner.join(120)
    assert not runner.is_alive()
    rep = result["reps"][0]
    # Ray routed around the dead replica: another one answered after the kill, and every
    # measured request is either a success or a counted failure
    others = {r: n for r, n in rep.extra["replicas"].items() if r != busiest["replica"]}
    assert sum(others.values()) > 0
    assert rep.extra["requests"]["measured"] == rep.latency["count"] + sum(rep.errors.values())
    # the dead replica's figures stay in the merged report
    rows = {r["replica"]: r for r in report("servescope").meta["replicas"]}
    assert rows[busiest["replica"]]["requests"] >= served_before


def test_a_replica_that_cannot_load_is_a_clear_error(ray_app, tmp_path):
    path = tmp_path / "broken_model.py"
    path.write_text(
        "import servescope\n"
        "class Broken(servescope.Model):\n"
        "    def load(self, device):\n"
        "        raise FileNotFoundError('weights.pt is missing')\n"
    )
    broken = load_target(f"{path}:Broken")
    with pytest.raises(EndpointError, match="weights.pt is missing"):
        deploy(broken(), app_name="broken", route_prefix="/broken")
    status, _, _ = _post(ray_app)  # the healthy application is untouched
    assert status == 200


def _write(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "payload.json"
    path.write_bytes(body)
    return path
