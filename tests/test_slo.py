"""SLOs: parsing, judging a run and each request (goodput), and the search for the highest rate."""

from __future__ import annotations

import numpy as np
import pytest

from servescope.load.bench import results_report
from servescope.exceptions import ConfigError
from servescope.load.loadgen import SSE, Result
from servescope.report import Report
from servescope.sections import Load, Requests, Slo
from servescope.load.slo import SLO, judge
from servescope.load.sweep import find_max, find_max_report

MS = 1_000_000


def test_parse_reads_each_objective_with_its_unit():
    slo = SLO.parse("p99<200ms, ttft_p95<=0.5s,itl_p99.9<50000us,tpot_mean<20ms,latency_max<1s")
    got = [(o.metric, o.stat, o.limit_ms, o.inclusive) for o in slo.objectives]
    assert got == [("latency", "p99", 200.0, False), ("ttft", "p95", 500.0, True), ("itl", "p99.9", 50.0, False),
                   ("tpot", "mean", 20.0, False), ("latency", "max", 1000.0, False)]  # fmt: skip
    assert str(slo) == "p99<200ms,ttft_p95<=0.5s,itl_p99.9<50000us,tpot_mean<20ms,latency_max<1s"


@pytest.mark.parametrize("text", ["", "p99", "p99<200", "p99 < 2 parsecs", "p99>200ms", "ttft_p0<1s", "p101<1s",
                                  "tokens_p99<1s", "p99<200ms,", "p99<-1ms"])  # fmt: skip
def test_parse_refuses_anything_else_naming_the_term(text):
    with pytest.raises(ConfigError, match="SLO"):
        SLO.parse(text)


def streamed(sched_ms, first_ms, gap_ms, n):
    times = [round((first_ms + k * gap_ms) * MS) for k in range(n)]
    return Result(sched_ms * MS, sched_ms * MS, times[-1], 200, None, None, (SSE, sched_ms * MS, times))


def test_goodput_counts_requests_whose_own_figures_met_every_objective():
    slo = SLO.parse("p99<500ms,ttft_p99<150ms,itl_p99<30ms")
    results = [streamed(0, 100, 20, 10) for _ in range(7)]
    results.append(streamed(0, 200, 20, 10))  # its TTFT misses
    results.append(streamed(0, 100, 40, 10))  # its gaps miss
    results.append(Result(0, 0, 50 * MS, 503, None, None))  # failed: never good
    rep = results_report(results, measure_from_ns=0, measure_until_ns=2_000 * MS, slo=slo)
    assert rep.load.slo.good == 7 and rep.load.slo.goodput_rps == 3.5
    assert rep.load.throughput_rps == 4.5
    # the run: the p99 of every TTFT is 200 ms, and more than 1% of requests failed
    checks = {c.objective: c for c in rep.load.slo.checks}
    assert not checks["ttft_p99<150ms"].met and rep.load.slo.met is False
    assert "1 of 10 requests failed" in checks["p99<500ms"].note


def test_the_run_is_judged_on_its_percentile_and_a_request_on_its_own_figure():
    slo = SLO.parse("p50<100ms")
    results = [Result(0, 0, 50 * MS, 200, None, None)] * 3 + [Result(0, 0, 150 * MS, 200, None, None)] * 2
    rep = results_report(results, measure_from_ns=0, measure_until_ns=1_000 * MS, slo=slo)
    assert rep.load.slo.met and rep.load.slo.checks[0].value_ms == 50.0  # the run's median
    assert rep.load.slo.good == 3  # two requests took 150 ms each


def test_a_stream_objective_on_responses_that_were_not_streamed_is_not_met():
    rep = results_report([Result(0, 0, 5 * MS, 200, None, None)], measure_from_ns=0, slo=SLO.parse("p99<1s,ttft_p99<1s"))
    [lat, ttft] = rep.load.slo.checks
    assert lat.met and not ttft.met and "no response was streamed" in ttft.note
    assert rep.load.slo.good == 0 and not rep.load.slo.met


def test_a_request_with_one_token_meets_the_gap_objectives_it_has_no_gap_for():
    slo = SLO.parse("itl_max<10ms,tpot_p99<10ms")
    assert slo.request_met(latency_ms=5, ttft_ms=5, gaps_ms=np.empty(0), tpot_ms=None)
    assert not slo.request_met(latency_ms=5, ttft_ms=5, gaps_ms=None)  # not streamed at all


class Capacity:
    """A fake endpoint that meets the SLO below ``capacity`` requests/s; each probe takes 3 s
    of a fake clock."""

    def __init__(self, capacity):
        self.capacity, self.now, self.rates = capacity, 0.0, []

    def clock(self):
        return self.now

    def probe(self, rate):
        self.now += 3.0
        self.rates.append(rate)
        rep = Report(latency={}, stages={}, meta={"rate": rate})
        rep.load = Load(requests=Requests(measured=10, ok=10), slo=Slo(slo="p99<50ms", met=rate <= self.capacity))
        return rep


def test_find_max_doubles_then_bisects_to_its_resolution():
    ep = Capacity(97.0)
    outcome, reports = find_max(ep.probe, start_rate=10, resolution=0.05, budget_s=300, clock=ep.clock)
    assert ep.rates[:5] == [10, 20, 40, 80, 160]
    assert outcome.stopped == "resolution reached"
    assert outcome.max_rate <= 97.0 < outcome.missed_rate <= outcome.max_rate * 1.05
    final = find_max_report(outcome, reports)
    assert final.meta["rate"] == outcome.max_rate
    assert [row.level for row in final.sweep.rows] == sorted(ep.rates)
    assert final.sweep.find_max.max_rate == outcome.max_rate


def test_find_max_halves_from_a_start_that_misses_and_says_when_nothing_met():
    ep = Capacity(30.0)
    outcome, _ = find_max(ep.probe, start_rate=100, resolution=0.05, clock=ep.clock)
    assert ep.rates[:3] == [100, 50, 25] and outcome.max_rate <= 30 < outcome.missed_rate
    ep = Capacity(0.0)
    outcome, _ = find_max(ep.probe, start_rate=1, min_rate=0.2, clock=ep.clock)
    assert outcome.max_rate is None and outcome.stopped == "no rate met the SLO"


def test_find_max_starts_no_probe_past_its_budget():
    ep = Capacity(97.0)
    outcome, reports = find_max(ep.probe, start_rate=10, resolution=0.001, budget_s=20, clock=ep.clock)
    assert outcome.stopped == "time budget spent" and ep.now <= 20
    assert outcome.max_rate == 80 and outcome.missed_rate == 120 and len(reports) == 6  # 6 probes of 3 s fit in 20 s


def test_judge_judges_a_saved_report_again_from_its_distributions():
    results = [streamed(0, 100, 20, 5) for _ in range(4)]
    rep = Report.from_json(results_report(results, measure_from_ns=0).to_json())
    [ttft, itl] = judge(SLO.parse("ttft_p50<101ms,itl_p99<19ms"), rep)
    assert ttft.met and ttft.value_ms == 100.0
    assert not itl.met and itl.value_ms == 20.0
