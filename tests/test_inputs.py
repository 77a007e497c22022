"""What a run sends: bodies in order or shuffled pass by pass, each result traced to its body,
and latency by input-size bucket."""

from __future__ import annotations


import pytest

from servescope.load.bench import BenchOptions, results_report
from servescope.exceptions import ConfigError
from servescope.load.inputs import RANDOM_LENGTH, send_order, size_buckets
from servescope.load.loadgen import SSE, Result

MS = 1_000_000


def test_cycle_sends_the_bodies_in_order():
    assert send_order(3, "cycle") == [0, 1, 2]


def test_random_shuffles_each_pass_over_every_body_and_is_seeded():
    order = send_order(3, "random", seed=7)
    assert order == send_order(3, "random", seed=7) != send_order(3, "random", seed=8)
    assert len(order) >= RANDOM_LENGTH and len(order) % 3 == 0
    assert all(sorted(order[k : k + 3]) == [0, 1, 2] for k in range(0, len(order), 3))  # every pass sends each once
    assert order[:30] != [0, 1, 2] * 10


def test_an_unknown_order_is_refused():
    with pytest.raises(ConfigError, match="order must be one of cycle, random"):
        send_order(3, "shuffled")


def test_the_requests_and_their_sizes_line_up_in_the_order_sent():
    options = BenchOptions(url="http://h/", bodies=[b"a", b"bb", b"ccc"], order="random", seed=1)
    raw, sizes = options.raw_requests(), options.report_options()["sizes"]
    assert len(raw) == len(sizes) == len(options.send_order)
    assert all(r.endswith(b"\r\n\r\n" + {1: b"a", 2: b"bb", 3: b"ccc"}[s]) for r, s in zip(raw, sizes))
    prompts = BenchOptions(url="http://h/", bodies=[b"{}", b"{}"], sizes=[5, 900], size_unit="chars")
    assert prompts.report_options() == {"openai": None, "model": None, "size_unit": "chars", "sizes": [5, 900], "asked_tokens": None}
    with pytest.raises(ConfigError, match="one size per body"):
        BenchOptions(url="http://h/", bodies=[b"{}"], sizes=[1, 2])


def ok(request: int, latency_ms: float, ttft_ms: float | None = None) -> Result:
    stream = None if ttft_ms is None else (SSE, 0, [round(ttft_ms * MS)])
    return Result(0, 0, round(latency_ms * MS), 200, None, None, stream, request)


def test_buckets_are_the_quartiles_of_the_sizes_sent_each_with_its_latency():
    sizes = [10, 20, 30, 40]  # request k has size sizes[k]
    results = [ok(k % 4, latency_ms=(k % 4 + 1) * 10) for k in range(400)]
    results.append(Result(0, 0, MS, 0, None, "timeout", None, 3))
    buckets = size_buckets(results, sizes)
    assert [(b.smallest, b.largest, b.count, b.errors) for b in buckets] == [
        (10, 10, 100, 0), (20, 20, 100, 0), (30, 30, 100, 0), (40, 40, 100, 1),
    ]  # fmt: skip
    assert [b.p50_ms for b in buckets] == [10, 20, 30, 40] and buckets[0].ttft_p50_ms is None


def test_many_sizes_are_cut_at_their_quartiles_a_size_on_a_cut_going_below_it():
    sizes = list(range(1, 101))  # 100 bodies of 1 to 100 bytes, each sent once
    buckets = size_buckets([ok(k, latency_ms=5, ttft_ms=2) for k in range(100)], sizes, unit="chars")
    assert [(b.smallest, b.largest, b.count, b.unit) for b in buckets] == [
        (1, 25, 25, "chars"), (26, 50, 25, "chars"), (51, 75, 25, "chars"), (76, 100, 25, "chars"),
    ]  # fmt: skip
    assert buckets[1].ttft_p50_ms == 2
    # nine in ten requests are small: the quartiles collapse to fewer buckets
    skewed = [ok(0 if k % 10 else 1 + (k // 10) % 5, latency_ms=5) for k in range(100)]
    assert [(b.smallest, b.largest, b.count) for b in size_buckets(skewed, [10, 20, 30, 40, 50, 60])] == [(10, 10, 90), (20, 60, 10)]


def test_no_buckets_when_every_body_has_the_same_size_or_none_is_known():
    assert size_buckets([ok(0, 5), ok(1, 6)], [7, 7]) == []
    assert size_buckets([ok(-1, 5)], [1, 2]) == []


def test_results_report_adds_by_size_from_each_results_request():
    sizes = [1, 1000]
    rep = results_report([ok(0, 5), ok(1, 50), ok(0, 5), ok(1, 50)], measure_from_ns=0, sizes=sizes)
    assert [(b.smallest, b.p50_ms) for b in rep.load.by_size] == [(1, 5), (1000, 50)]
    assert results_report([ok(0, 5)], measure_from_ns=0).load.by_size == []


def test_the_terminal_shows_latency_by_size_and_the_output_tokens():
    from servescope.load.openai_api import token_stats
    from servescope.renderers.terminal import render_terminal

    results = [ok(0, 5, ttft_ms=2), ok(1, 50, ttft_ms=20)]
    rep = results_report(results, measure_from_ns=0, measure_until_ns=1000 * MS, sizes=[12, 3400], size_unit="chars")
    rep.load.tokens = token_stats(results, api="completions", model="m\x1b[2J", window_s=1.0)
    text = render_terminal(rep)
    assert "Latency by input size" in text and "input size (chars)" in text
    assert [line.split()[:6] for line in text.splitlines() if line.startswith(("12 ", "3,400"))] == [
        ["12", "│", "1", "│", "0", "│"], ["3,400", "│", "1", "│", "0", "│"],
    ]  # fmt: skip
    assert "Output tokens (completions, m[2J): 2 in 2 responses (2 counted from deltas)" in text  # no escape reaches the terminal
