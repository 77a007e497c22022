from __future__ import annotations

import numpy as np
import pytest

from servescope import Recorder
from servescope.compare import Change, Comparison, compare, rank_sum_z
from servescope.renderers.compare import ComparisonRenderer, render_compare
from rich.console import Console


def report(infer_ms: float, n: int = 200, seed: int = 0, tput: float | None = None):
    rng = np.random.default_rng(seed)
    rec = Recorder()
    for v in rng.normal(infer_ms, infer_ms * 0.05, n):
        rec.record_durations({"infer": float(v), "serialize": 1.0}, float(v) + 1.0)
    rep = rec.report(title=f"infer {infer_ms}")
    if tput is not None:
        rep.extra["throughput_rps"] = tput
    return rep


def test_a_real_change_is_beyond_noise_and_a_rerun_is_not():
    before, after, again = report(10.0, seed=1, tput=100), report(5.0, seed=2, tput=190), report(10.0, seed=3, tput=101)
    table = compare(before, after)
    p50 = table.summary[0]
    assert p50.metric == "p50 latency ms" and p50.significant is True and p50.better is True
    assert p50.ratio == pytest.approx(6 / 11, rel=0.05)
    infer = next(r for r in table.stages if r.metric == "infer")
    assert infer.significant is True
    same = compare(before, again)
    assert same.summary[0].significant is False
    tput = next(r for r in table.summary if r.metric == "throughput req/s")
    assert tput.ratio == pytest.approx(1.9)


def test_rank_sum_matches_the_textbook_case():
    # identical samples: z = 0; fully separated samples: |z| large
    a = np.arange(20, dtype=float)
    assert rank_sum_z(a, a.copy()) == pytest.approx(0.0)
    assert rank_sum_z(a, a + 100) < -5


def test_without_samples_significance_is_unknown_not_invented():
    before, after = report(10.0), report(5.0)
    before.distributions = {}
    table = compare(before, after)
    assert table.summary[0].significant is None


def test_the_table_renders():
    console = Console(record=True, width=120)
    render_compare(compare(report(10.0, seed=1), report(5.0, seed=2)), console=console)
    text = console.export_text()
    assert "Before / after: infer 10.0 vs infer 5.0" in text and "faster" in text and "model inference" in text


def test_stage_names_from_the_reports_print_as_plain_text():
    import io

    reports = []
    for ms in (10.0, 5.0):
        rec = Recorder()
        for _ in range(20):
            rec.record_durations({"[/]\x1b[2J": ms, "[link=http://x]y[/link]": 1.0}, ms + 1.0)
        reports.append(rec.report())
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    render_compare(compare(*reports), console=console)  # '[/]' raised MarkupError
    out = console.file.getvalue()
    assert "[/][2J (mean ms)" in out and "[link=http://x]y[/link]" in out and "\x1b[2J" not in out


def test_a_comparison_is_a_value_with_its_reports_and_the_old_dict_form():
    before, after = report(10.0, seed=1), report(5.0, seed=2)
    table = compare(before, after)
    assert isinstance(table, Comparison) and table.before is before and table.after is after
    assert [c.metric for c in table.stages] == ["infer", "serialize"]
    assert all(isinstance(c, Change) for c in (*table.summary, *table.stages))
    old = table.to_dict()  # what compare() returned before: plain data
    assert old["before"] == "infer 10.0" and old["after"] == "infer 5.0"
    assert old["summary"][0] == {"metric": "p50 latency ms", "before": table.summary[0].before, "after": table.summary[0].after,
                                 "ratio": table.summary[0].ratio, "significant": True, "better": True,
                                 "low": table.summary[0].low, "high": table.summary[0].high, "higher_is_better": False}
    with pytest.warns(DeprecationWarning, match=r"comparison\.summary"):
        assert table["summary"] == old["summary"]  # scripts that read it as a dict keep working, warned


def test_the_comparison_renderers_share_one_shape_and_the_wrappers_match_them():
    import io

    from servescope.renderers import ComparisonHTMLRenderer, ComparisonRenderer
    from servescope.renderers.html import render_comparison_html

    before, after = report(10.0, seed=1), report(5.0, seed=2)
    table = compare(before, after)
    text = ComparisonRenderer(before="FastAPI", after="serve").render(table)  # no console: text only
    assert "FastAPI" in text and "model inference (mean ms)" in text and "1.83x faster" in text
    console = Console(file=io.StringIO(), width=110)
    render_compare(table, console=console, before="FastAPI", after="serve")
    assert console.file.getvalue() == text
    page = ComparisonHTMLRenderer().render(table)
    assert page == render_comparison_html(before, after, table)
    assert "<td>p50 latency ms</td>" in page and "<td>model inference (mean ms)</td>" in page
    assert page.count("<h2>infer 10.0</h2>") == 1 and page.count("<h2>infer 5.0</h2>") == 1
    doctor = report(10.0)
    assert "servescope doctor on the slow service" in ComparisonHTMLRenderer(doctor=doctor).render(table)



# -- honest: noise from the runs' own variation over time, not from correlated samples ---------


def drifting(median_ms: float, seconds: int, seed: int, per_second: int = 200, drift: float = 0.08):
    """A run of a server whose speed wanders from second to second (a shared machine): within a
    second requests share the machine's state, so they are not independent observations."""
    rng = np.random.default_rng(seed)
    rec = Recorder()
    for _ in range(seconds):
        level = median_ms * float(np.exp(rng.normal(0, drift)))
        for v in level * np.exp(rng.normal(0, 0.25, per_second)):
            rec.record_durations({"infer": float(v)}, float(v))
    return rec.report(target="http://127.0.0.1:8000/predict")


def test_the_same_server_twice_is_within_noise_and_20_percent_slower_is_slower():
    """What #16 asks: 9 of 10 reruns of an unchanged server within noise, 9 of 10 runs of a server
    made 20% slower called slower. Ten-second runs whose speed wanders ~8% from second to second
    (as runs on this shared 2-core machine do): 2,000 requests each, which a rank test on the
    samples calls "different" most of the time."""
    same = [compare(drifting(10.0, 10, 2 * i), drifting(10.0, 10, 2 * i + 1)).summary[0] for i in range(10)]
    slower = [compare(drifting(10.0, 10, 100 + 2 * i), drifting(12.0, 10, 101 + 2 * i)).summary[0] for i in range(10)]
    assert sum(c.significant is False for c in same) >= 9, [c.interval_words for c in same]
    assert sum(c.significant is True and c.better is False for c in slower) >= 9, [c.interval_words for c in slower]
    z = [abs(rank_sum_z(compare.__globals__["_values"](drifting(10.0, 10, 2 * i).distributions["total"]),
                        compare.__globals__["_values"](drifting(10.0, 10, 2 * i + 1).distributions["total"]))) for i in range(10)]
    assert sum(v > 3 for v in z) >= 3  # the old test, on the same runs: "beyond noise" for no change


def test_ratios_print_in_words_with_three_figures_and_never_round_onto_a_grid():
    from servescope.compare import _ratio_words

    assert _ratio_words(1 / 130.7, False) == "131x faster" and _ratio_words(1 / 127.9, False) == "128x faster"
    assert _ratio_words(2.59, False) == "2.59x slower" and _ratio_words(1.04, False) == "4.0% slower"
    assert _ratio_words(1 / 2500, False) == "2500x faster"  # not "gone"
    assert _ratio_words(0.0, False) == "gone" and _ratio_words(1.9, True) == "1.90x more"
    change = compare(drifting(10.0, 10, 1), drifting(5.0, 10, 2)).summary[0]
    assert change.words.endswith("x faster") and change.interval_words.endswith("x faster") and "-" in change.interval_words


def test_too_short_a_run_cannot_tell_and_says_so():
    change = compare(report(10.0, n=300, seed=1), report(5.0, n=300, seed=2)).summary
    assert change[0].significant is True  # 300 requests: ten blocks of 30 for the median
    p99 = change[2]  # but a p99 needs 200 a block, five blocks at least
    assert p99.metric == "p99 latency ms" and p99.significant is None and p99.interval_words == "-"
    assert compare(report(10.0, n=100, seed=1), report(5.0, n=100, seed=2)).summary[0].significant is None


def test_fail_if_slower_names_the_figures_beyond_noise_and_over_the_threshold():
    slower = compare(drifting(10.0, 10, 3), drifting(13.0, 10, 4))
    assert {c.metric for c in slower.slower_than(0.10)} >= {"p50 latency ms", "mean latency ms"}
    assert slower.slower_than(0.5) == []
    assert compare(drifting(10.0, 10, 5), drifting(10.0, 10, 6)).slower_than(0.10) == []  # an unchanged server


def test_what_cannot_be_told_is_said_with_the_numbers_needed():
    short = compare(report(10.0, n=14, seed=1), report(10.0, n=14, seed=2))
    assert all(c.significant is None for c in short.summary if c.ratio is not None and not c.higher_is_better)
    [note] = short.notes
    assert "can't tell for p50, p95, p99, mean" in note and "p50 150" in note and "14 and 14" in note
    text = ComparisonRenderer().render(short)
    assert "measure longer" in text


def test_fail_if_slower_that_cannot_judge_fails_rather_than_passing_blind(tmp_path):
    from servescope.cli import main

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    report(10.0, n=14, seed=1).save(a)
    report(10.0, n=14, seed=2).save(b)
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10%"]) == 3
    report(10.0, n=400, seed=1).save(a)
    report(10.0, n=400, seed=2).save(b)
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10%"]) == 0


def streamed(ttft_ms: float, seed: int, *, concurrency: int = 8):
    """A bench run of a token stream: 2,000 responses, TTFT around ``ttft_ms``, 20 ms gaps."""
    from servescope.sections import Load, Stream
    from servescope.stats import Distribution

    rng = np.random.default_rng(seed)
    rep = drifting(ttft_ms + 400, 10, seed)
    dists = {name: Distribution() for name in ("ttft", "itl", "tpot")}
    dists["ttft"].extend(ttft_ms * np.exp(rng.normal(0, 0.1, 2000)))
    dists["itl"].extend(20 * np.exp(rng.normal(0, 0.1, 40000)))
    dists["tpot"].extend(20 * np.exp(rng.normal(0, 0.05, 2000)))
    rep.load = Load(throughput_rps=200.0, stream=Stream.from_distributions(dists, responses=2000, chunks=42000))
    rep.load.stream.chunks_per_s = 4200.0
    rep.meta["concurrency"] = concurrency
    return rep


def test_streamed_runs_compare_time_to_first_token_and_the_gaps_with_intervals():
    table = compare(streamed(100.0, 1), streamed(130.0, 2))
    rows = {c.metric: c for c in table.summary}
    assert {"ttft p50 ms", "ttft p99 ms", "itl p50 ms", "itl p99 ms", "tpot p50 ms", "tokens/s"} <= set(rows)
    ttft = rows["ttft p50 ms"]
    assert ttft.significant and ttft.better is False and 1.25 < ttft.ratio < 1.35 and ttft.low > 1.03
    assert rows["itl p50 ms"].significant is False  # the gaps did not change
    assert "ttft p50 ms" in [c.metric for c in table.slower_than(0.10)]  # --fail-if-slower fails on TTFT too


def test_runs_at_different_loads_say_so():
    notes = compare(streamed(100.0, 1, concurrency=1), streamed(100.0, 2, concurrency=8)).notes
    assert any("different load (concurrency=1 before, concurrency=8 after)" in n for n in notes)
    assert not any("different load" in n for n in compare(streamed(100.0, 1), streamed(100.0, 2)).notes)


def test_an_interval_inside_the_run_to_run_band_is_explained():
    c = Change("p50 latency ms", 10.0, 10.2, 1.02, False, None, 1.01, 1.025)
    table = Comparison(report(10.0), report(10.2), (c,), ())
    assert any(n.startswith("p50 latency: the interval excludes no change, but not the +-3%") for n in table.notes)
