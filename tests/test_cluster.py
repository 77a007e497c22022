"""Ray support without a cluster: splitting load, merging generators and replicas, bad input."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from servescope import Recorder, Report
from servescope.load.bench import BenchOptions
from servescope.cli import main
from servescope.load.cluster import _merge, connect, split_level
from servescope.exceptions import ConfigError, EndpointError, MissingDependencyError, RecordError
from servescope.load.loadgen import Result, schedule
from servescope.serve.ray_serve import StatsCollector

MS = 1_000_000


def test_closed_loop_connections_are_dealt_out():
    assert split_level("concurrency", 5, 2) == [(3, 0), (2, 0)]
    assert split_level("concurrency", 1, 3) == [(1, 0)]  # never a generator with nothing to do
    assert sum(c for c, _ in split_level("concurrency", 64, 7)) == 64


def test_open_loop_schedules_interleave_into_the_single_generator_one():
    rate, k, n = 300.0, 4, 400
    shares = split_level("rate", rate, k)
    assert all(r == rate / k for r, _ in shares)
    merged = sorted(t for r, off in shares for t in itertools.islice(schedule(r, off), n // k))
    single = list(itertools.islice(schedule(rate, 0), n))
    assert np.abs(np.asarray(merged) - np.asarray(single)).max() <= 1  # ns rounding


def _outcome(latencies_ms, node="n1"):
    return {
        "results": [Result(0, 0, round(ms * MS), 200, b"infer;dur=1, total;dur=1", None) for ms in latencies_ms],
        "until": 10_000 * MS,
        "lags": [],
        "cpu_s": 0.01,
        "node": node,
        "start_late_ms": 0.1,
    }


def test_generators_merge_to_exact_percentiles_and_a_lost_one_is_named():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(1, 5, 300), rng.uniform(4, 40, 100)
    options = BenchOptions(url="http://127.0.0.1:1/", concurrency=[4])
    rep = _merge(options, "concurrency", 4, [_outcome(a), "generator 1: ActorDiedError: node died", _outcome(b, "n2")], None)
    union = np.concatenate([a, b])
    assert rep.latency["count"] == 400
    assert rep.latency["p99_ms"] == pytest.approx(np.percentile(union, 99), abs=1e-3)  # never an average of p99s
    assert [g["node"] for g in rep.extra["generators"]] == ["n1", "n2"]
    assert rep.extra["generators_lost"] == ["generator 1: ActorDiedError: node died"]
    with pytest.raises(EndpointError, match="every load generator was lost") as lost:
        _merge(options, "concurrency", 4, ["generator 0: gone"], None)
    assert not isinstance(lost.value, ConfigError)  # nothing the user set was wrong


def test_replicas_figures_merge_exactly_in_the_collector():
    rng = np.random.default_rng(2)
    collector = StatsCollector("app")
    values = {}
    for rid, scale in (("r1", 1.0), ("r2", 10.0)):
        rec = Recorder(deltas=True)
        values[rid] = rng.exponential(scale, 500)
        for i, ms in enumerate(values[rid]):
            rec.record_durations({"infer": ms}, ms + 0.5)
            if i == 250:  # two shipments per replica: deltas, not the whole history each time
                collector.push(rid, "node", rec.take_delta().to_dict())
        collector.push(rid, "node", rec.take_delta().to_dict())
        assert rec.take_delta() is None  # nothing new since
    collector.push("r3", "node", None)  # a replica that served nothing yet is listed, not counted
    rep = collector.report()
    union = np.concatenate(list(values.values()))
    assert rep["latency"]["count"] == 1000
    assert rep["stages"]["infer"]["p95_ms"] == pytest.approx(np.percentile(union, 95), abs=1e-3)
    assert [(r["replica"], r["requests"]) for r in rep["meta"]["replicas"]] == [("r1", 500), ("r2", 500), ("r3", 0)]


def test_take_delta_needs_a_recorder_that_keeps_deltas():
    with pytest.raises(RecordError, match="deltas=True"):
        Recorder().take_delta()


@pytest.mark.parametrize("address", ["nohost", "ray://host:", "host:port"])
def test_a_malformed_ray_address_is_refused(address):
    pytest.importorskip("ray")
    with pytest.raises(ConfigError, match="malformed Ray address"):
        connect(address)


def test_an_unreachable_ray_address_fails_fast_with_one_line(capsys):
    pytest.importorskip("ray")
    code = main(["bench", "http://127.0.0.1:9/", "--ray", "127.0.0.1:1", "-d", "1s"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "cannot reach the Ray cluster at 127.0.0.1:1" in err
    with pytest.raises(EndpointError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        connect("127.0.0.1:1")


def test_without_ray_installed_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"servescope\[ray\]"):
        connect("auto")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "http://127.0.0.1:9/", "--generators", "2"], "--generators goes with --ray"),
        (["serve", "examples/mlp_serve.py:MLP", "--replicas", "2"], "--replicas goes with --ray"),
    ],
)
def test_ray_options_without_ray_are_refused(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_terminal_view_says_where_the_load_came_from_and_who_answered():
    from rich.console import Console

    from servescope.renderers.terminal import render_terminal

    options = BenchOptions(url="http://127.0.0.1:1/", concurrency=[4])
    rep = _merge(options, "concurrency", 4, [_outcome([1.0, 2.0]), "generator 1: ActorDiedError: node died"], None)
    rep.extra["replicas"] = {"r1": 1, "r2": 1}
    console = Console(record=True, width=160)
    render_terminal(rep, console=console)
    text = console.export_text()
    assert "Load from 2 generator(s) on 1 node(s); 1 lost: generator 1: ActorDiedError: node died" in text
    assert "Answered by 2 replica(s): r1 1, r2 1" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [({"replicas": 0}, "replicas must be a whole number >= 1"), ({"max_batch_size": 0}, "max_batch_size must be")],
)
def test_a_deployment_with_bad_options_is_refused_before_reaching_a_cluster(kwargs, message):
    pytest.importorskip("ray.serve")
    from servescope.loader import load_target
    from servescope.serve.ray_serve import deployment

    model = load_target(str(Path(__file__).resolve().parent.parent / "examples" / "mlp_serve.py") + ":MLP")()
    with pytest.raises(ConfigError, match=message):
        deployment(model, **kwargs)
    assert type(deployment(model, autoscaling_config={"min_replicas": 1, "max_replicas": 3})).__name__ == "Application"


def test_the_html_report_lists_generators_and_replicas():
    from servescope.renderers.html import render_html

    options = BenchOptions(url="http://127.0.0.1:1/", concurrency=[4])
    rep = _merge(options, "concurrency", 4, [_outcome([1.0, 2.0], node="host-a/1234abcd"), "generator 1: gone"], None)
    rep.extra["replicas"] = {"r1": 2}
    page = render_html(rep)
    assert "<h2>Load generators</h2>" in page and "host-a/1234abcd" in page and "lost: generator 1: gone" in page
    assert "<h2>Replicas that answered</h2>" in page and "<td>r1</td><td>2</td>" in page


def test_stage_names_folded_on_any_replica_survive_the_collector():
    # Ray Serve's aggregation: each replica's deltas merged with Report.combine, twice over
    collector = StatsCollector("app")
    for rid in ("r1", "r2"):
        rec = Recorder(deltas=True, max_stage_names=1)
        for i in range(3):
            rec.record_durations({f"{rid}_step_{i}": 1.0}, 2.0)
            collector.push(rid, "node", rec.take_delta().to_dict())
    rep = Report.from_dict(collector.report())
    assert rep.folded_stage_names.examples == ["r1_step_1", "r1_step_2", "r2_step_1", "r2_step_2"]
    assert rep.folded_stage_names.limit == 1 and "not_combined" not in rep.meta
    assert rep.stages["(more stages)"]["count"] == 4


def test_a_bench_level_on_ray_keeps_its_generators_in_the_load_section():
    options = BenchOptions(url="http://127.0.0.1:1/", concurrency=[4])
    rep = _merge(options, "concurrency", 4, [_outcome([1.0, 2.0]), "generator 1: gone", _outcome([3.0], "n2")], None)
    assert [(g.generator, g.node, g.requests) for g in rep.load.generators] == [(0, "n1", 2), (2, "n2", 1)]
    assert rep.load.generators_lost == ["generator 1: gone"] and rep.load.requests.measured == 3
    back = Report.from_json(rep.to_json())
    assert back.load == rep.load
