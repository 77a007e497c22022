"""Load generators spread over two Ray nodes (a two-raylet cluster on this machine)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from servescope.load.bench import BenchOptions
from servescope.load.cluster import run_bench_ray


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    ray.shutdown()
    cluster.shutdown()


def test_generators_land_on_different_nodes_and_merge(two_nodes, test_server):
    options = BenchOptions(url=test_server + "/delay", concurrency=[4], duration_s=2.0, warmup_s=0.3)
    [rep] = run_bench_ray(options, address=two_nodes, generators=2)
    rows = rep.extra["generators"]
    assert len({r["node"] for r in rows}) == 2  # one generator per node (SPREAD)
    assert [r["requests"] for r in rows] == pytest.approx([rows[0]["requests"]] * 2, rel=0.3)  # 2 connections each
    assert rep.latency["count"] + rep.extra["requests"]["warmup"] == sum(r["requests"] for r in rows)
    assert 20 <= rep.latency["p50_ms"] <= 40  # the server's fixed 20 ms
    assert rep.stages["infer"]["p50_ms"] == pytest.approx(20, abs=8)
