from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from servescope import Distribution, Recorder


def test_recording_from_many_threads_loses_nothing(speedups):
    rec = Recorder()
    dist = Distribution(exact_limit=1000)  # folds into a sketch part-way: the other path

    def work():
        for i in range(5000):
            rec.record_ns({"infer": 1000 + i}, 2000 + i)
            dist.add(1.0 + i % 7)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec) == 40_000
    assert len(rec.stages["infer"]) == 40_000
    assert len(dist) == 40_000


def test_failed_requests_count_but_stay_out_of_latency(speedups):
    rec = Recorder()
    rec.record_durations({"infer": 2.0}, 3.0)
    rec.record_durations({}, 50.0, error="HTTP 503")
    assert len(rec) == 2 and len(rec.latency) == 1 and rec.errors == {"HTTP 503": 1}
    assert rec.first_ms == 3.0


def test_requests_with_different_stage_sets_each_land_in_their_stages(speedups):
    rec = Recorder()
    rec.record_ns({"preprocess": 1_000_000, "infer": 4_000_000}, 6_000_000)
    rec.record_ns({"infer": 2_000_000, "preprocess": 3_000_000}, 5_500_000)  # same names, other order
    rec.record_ns({"infer": 8_000_000, "serialize": 500_000}, 9_000_000)
    rec.record_ns({}, 250_000)  # a request that ran no stage
    rec.record_ns({"infer": 1_000_000}, 7_000_000, error="RuntimeError: boom")
    assert sorted(rec.stages["infer"].values()) == [2.0, 4.0, 8.0]
    assert sorted(rec.stages["preprocess"].values()) == [1.0, 3.0]
    assert rec.stages["serialize"].values().tolist() == [0.5]
    assert sorted(rec.latency.values()) == [0.25, 5.5, 6.0, 9.0]
    assert rec.errors == {"RuntimeError": 1}


def test_fold_rows_makes_float64_ms_columns_per_set_of_stage_names(speedups):
    rows = [
        ({"infer": 2_000_000, "send": 500_000}, 3_000_000, None, 1.0),
        ({}, 250_000, None, 2.0),  # ran no stage
        ({"infer": 1_000_000}, 9_000_000, "HTTP 503", 3.0),
        ({"send": 1_500_000, "infer": 4_000_000}, 6_000_000, None, 4.0),  # the same names, in another order
        ({"infer": 3_000_000, "send": 250_000}, 4_000_000, None, 5.0),
    ]
    totals, groups, failed = speedups.module.fold_rows(rows)
    assert np.frombuffer(totals).tolist() == [3.0, 0.25, 6.0, 4.0]
    assert [(keys, np.frombuffer(buf).tolist()) for keys, buf in groups] == [
        (("infer", "send"), [2.0, 0.5, 3.0, 0.25]),  # a row per request, a column per name
        ((), []),
        (("send", "infer"), [1.5, 4.0]),
    ]
    assert failed == [(9_000_000, "HTTP 503")]
    with pytest.raises(TypeError, match="rows"):
        speedups.module.fold_rows([("not", "a", "row")])
    with pytest.raises(TypeError, match="rows"):
        speedups.module.fold_rows([(["infer"], 1, None, None)])
    with pytest.raises(TypeError, match="list of rows"):
        speedups.module.fold_rows(tuple(rows))


def test_fold_rows_keeps_every_value_exactly_over_many_rows(speedups):
    rng = random.Random(7)
    sets = [("receive", "infer", "other"), ("infer", "receive", "other"), ("queue", "infer", "send"), ()]
    rows = []
    for _ in range(3000):
        names = rng.choice(sets)
        durations = {n: rng.randrange(0, 10**10) for n in names}
        error = "HTTP 500" if rng.random() < 0.1 else None
        rows.append((durations, rng.randrange(0, 10**10), error, 1.5))
    ok = [r for r in rows if r[2] is None]
    totals, groups, failed = speedups.module.fold_rows(rows)
    assert np.array_equal(np.frombuffer(totals), np.array([r[1] for r in ok], dtype=float) / 1e6)
    assert failed == [(r[1], r[2]) for r in rows if r[2] is not None]
    assert [keys for keys, _ in groups] == list(dict.fromkeys(tuple(r[0]) for r in ok))  # first seen, first
    for keys, buf in groups:
        want = np.array([[r[0][k] for k in keys] for r in ok if tuple(r[0]) == keys], dtype=float) / 1e6
        assert np.array_equal(np.frombuffer(buf), want.ravel())


def test_stage_names_made_per_request_stay_bounded(speedups, caplog):
    rec = Recorder(max_stage_names=3)
    with caplog.at_level("WARNING", logger="servescope"):
        for i in range(50):
            rec.record_ns({f"infer_{i}": 1_000_000, f"decode_{i}": 500_000, "infer": 2_000_000}, 4_000_000)
    stages = rec.stages
    assert set(stages) == {"infer_0", "decode_0", "infer_1", "infer", "(more stages)"}
    assert len(stages["(more stages)"]) == 49  # one sample per request: its folded stages summed
    assert sorted(stages["(more stages)"].values()) == [0.5] + [1.5] * 48  # request 1 kept infer_1 apart
    assert len(stages["infer"]) == 50  # the canonical names are always kept apart
    assert sum("counted together" in r.getMessage() for r in caplog.records) == 1
    rep = rec.report()
    assert rep.extra["folded_stage_names"] == {
        "limit": 3, "examples": ["decode_1", "infer_2", "decode_2", "infer_3", "decode_3"], "into": "(more stages)",
    }  # fmt: skip
    from servescope import Report
    from servescope.renderers.terminal import render_terminal

    assert Report.from_json(rep.to_json()).extra["folded_stage_names"]["limit"] == 3
    assert "counted together as '(more stages)'" in render_terminal(rep)


def test_a_delta_keeps_the_same_names_apart(speedups):
    rec = Recorder(max_stage_names=1, deltas=True)
    rec.record_ns({"tokenize": 1_000_000}, 2_000_000)
    rec.take_delta()
    rec.record_ns({"tokenize": 1_000_000, "detokenize": 3_000_000}, 5_000_000)
    delta = rec.take_delta()
    assert set(delta.stages) == {"tokenize", "(more stages)"}
    assert set(rec.report().stages) == set(delta.stages)


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_a_bad_stage_name_limit_is_refused(bad):
    from servescope.exceptions import ConfigError

    with pytest.raises(ConfigError, match="max_stage_names"):
        Recorder(max_stage_names=bad)
