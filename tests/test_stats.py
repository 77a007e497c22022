from __future__ import annotations

import math

import numpy as np
import pytest

from servescope import Distribution, RecordError
from servescope.stats import ALPHA, summarize


def test_exact_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    values = rng.lognormal(0, 1, 5000)
    d = Distribution()
    d.extend(values[:10])
    for v in values[10:]:
        d.add(float(v))
    assert d.exact
    for q in (0, 50, 90, 95, 99, 100):
        assert d.percentile(q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert d.mean() == pytest.approx(values.mean())
    assert d.max() == values.max()


def test_small_known_values():
    d = Distribution()
    d.extend([1, 2, 3, 4])
    assert d.percentile(50) == 2.5
    s = summarize(d)
    assert s["count"] == 4 and s["max_ms"] == 4 and s["mean_ms"] == 2.5


def test_past_the_limit_memory_is_bounded_and_quantiles_within_alpha():
    rng = np.random.default_rng(2)
    values = rng.lognormal(1, 1.5, 50_000)
    d = Distribution(exact_limit=1000)
    d.extend(values)
    assert not d.exact
    assert len(d) == values.size
    assert d._counts.size < 4000  # bounded, whatever the number of samples
    for q in (1, 50, 90, 95, 99, 99.9):
        # each quantile lies within alpha of a sample of (nearly) that rank
        lo = np.percentile(values, q, method="lower")
        hi = np.percentile(values, q, method="higher")
        got = d.percentile(q)
        assert lo * (1 - ALPHA) - 1e-12 <= got <= hi * (1 + ALPHA) + 1e-12, q
    assert d.max() == values.max() and d.min() == values.min()


def test_merged_sketches_equal_one_sketch_of_all_samples():
    rng = np.random.default_rng(3)
    a, b = rng.exponential(5, 3000), rng.exponential(50, 3000)
    da, db, dall = (Distribution(exact_limit=10) for _ in range(3))
    da.extend(a)
    db.extend(b)
    dall.extend(np.concatenate([a, b]))
    merged = da.merge(db)
    assert len(merged) == 6000
    assert merged.percentiles([50, 95, 99]) == dall.percentiles([50, 95, 99])


def test_merging_exact_distributions_stays_exact():
    a, b = Distribution(), Distribution()
    a.extend([1, 2, 3])
    b.extend([10, 20])
    m = a.merge(b)
    assert m.exact and sorted(m.values().tolist()) == [1, 2, 3, 10, 20]


def test_merging_exact_into_sketch_keeps_every_count():
    a, b = Distribution(exact_limit=5), Distribution()
    a.extend(range(1, 20))
    b.extend([1000.0])
    m = b.merge(a)
    assert not m.exact and len(m) == 20 and m.max() == 1000.0


@pytest.mark.parametrize("kind", ["exact", "sketch"])
def test_round_trip_through_dict(kind):
    d = Distribution(exact_limit=100 if kind == "exact" else 10)
    d.extend(np.linspace(0.01, 50, 80))
    back = Distribution.from_dict(d.to_dict())
    assert back.exact == (kind == "exact")
    assert back.percentiles([50, 99]) == pytest.approx(d.percentiles([50, 99]))
    assert len(back) == 80


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_values_are_refused_and_nothing_is_lost(bad):
    d = Distribution()
    d.extend([1.0, 2.0])
    with pytest.raises(RecordError, match="finite and >= 0"):
        d.add(bad)
    with pytest.raises(RecordError):
        d.extend([3.0, bad])
    assert d.values().tolist() == [1.0, 2.0]


def test_empty_distribution_reports_no_numbers():
    s = summarize(Distribution())
    assert s["count"] == 0 and s["p50_ms"] is None
