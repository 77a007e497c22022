from __future__ import annotations

import io
import itertools

import numpy as np
import pytest

from servescope.load.bench import CLIENT_WAIT, NETWORK, PROXY, BenchOptions, parse_duration, results_report
from servescope.exceptions import ConfigError, EndpointError
from servescope.load.loadgen import Result, URL, build_requests, schedule
from servescope.renderers.html import render_html
from servescope.load.sweep import saturation

MS = 1_000_000


@pytest.mark.parametrize("text, seconds", [("10s", 10), ("500ms", 0.5), ("2m", 120), ("1.5", 1.5), ("1h", 3600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1s", "10 parsecs", ""])
def test_bad_durations(text):
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)


def test_constant_schedule_is_exact():
    times = list(itertools.islice(schedule(200, 1_000), 4))
    assert times == [1_000, 1_000 + 5 * MS, 1_000 + 10 * MS, 1_000 + 15 * MS]


def test_poisson_schedule_has_the_rate_and_is_seeded():
    a = np.array(list(itertools.islice(schedule(500, 0, poisson=True, seed=7), 20_000)))
    b = list(itertools.islice(schedule(500, 0, poisson=True, seed=7), 10))
    assert a[:10].tolist() == b
    gaps = np.diff(a) / 1e9
    assert gaps.mean() == pytest.approx(1 / 500, rel=0.03)
    assert gaps.std() == pytest.approx(1 / 500, rel=0.05)  # exponential: std == mean


@pytest.mark.parametrize("rate", [0, -5, float("nan")])
def test_schedule_refuses_a_rate_that_is_not_positive(rate):
    with pytest.raises(ConfigError, match="rate must be > 0"):
        next(schedule(rate, 0))


def stalled_open_loop():
    """100 req/s for 3 s; the server answers in 1 ms, except one 500 ms stall at t=1 s.

    One connection: a request is sent when scheduled or when the previous one is done,
    whichever is later (what a closed-loop tool does, and what hides the stall)."""
    results = []
    free_at = 0
    for k in range(300):
        sched = k * 10 * MS
        sent = max(sched, free_at)
        service = 500 * MS if k == 100 else 1 * MS
        done = sent + service
        free_at = done
        results.append(Result(sched, sent, done, 200, None, None))
    return results


def test_open_loop_latency_counts_from_the_schedule_so_a_stall_shows():
    rep = results_report(stalled_open_loop(), measure_from_ns=0)
    assert rep.latency["count"] == 300
    # the stall delays the 50 requests scheduled behind it: 1% + of requests see >= 250 ms
    assert rep.latency["p99_ms"] >= 250
    assert rep.latency["max_ms"] == pytest.approx(500, abs=1)
    un = rep.extra["uncorrected"]
    # measured from the actual send, only one request looks slow: the stall is hidden
    assert un["p99_ms"] < 5 and un["max_ms"] == pytest.approx(500, abs=1)
    assert rep.latency["p50_ms"] == pytest.approx(1.0, abs=0.01)


def test_warmup_requests_are_excluded():
    rep = results_report(stalled_open_loop(), measure_from_ns=2000 * MS)
    assert rep.latency["count"] == 100
    assert rep.extra["requests"] == {"measured": 100, "ok": 100, "warmup": 200}
    assert rep.extra["throughput_rps"] == pytest.approx(100, rel=0.02)


def test_server_timing_becomes_the_breakdown_and_the_network_is_the_rest():
    st = b"preprocess;dur=2, infer;dur=5, total;dur=7.5"
    results = [Result(0, 0, 10 * MS, 200, st, None), Result(0, 1 * MS, 11 * MS, 200, st, None)]
    rep = results_report(results, measure_from_ns=0)
    assert rep.stages["infer"]["mean_ms"] == 5
    assert rep.stages[NETWORK]["mean_ms"] == pytest.approx(2.5)  # 10 ms seen - 7.5 ms server
    assert rep.stages[CLIENT_WAIT]["count"] == 1  # the second waited 1 ms for its slot
    assert rep.extra["server_timing"]["hint"] is None
    assert sum(s["share"] for s in rep.stages.values()) == pytest.approx(1.0, abs=1e-3)


def test_without_server_timing_the_report_says_how_to_get_it():
    rep = results_report([Result(0, 0, 3 * MS, 200, None, None)], measure_from_ns=0)
    assert rep.stages == {}
    assert "ServescopeMiddleware" in rep.extra["server_timing"]["hint"]


def test_errors_are_counted_by_kind_and_kept_apart():
    results = [
        Result(0, 0, 2 * MS, 200, None, None),
        Result(0, 0, 1 * MS, 503, None, None),
        Result(0, 0, 30_000 * MS, 0, None, "timeout"),
        Result(0, 0, 1 * MS, 0, None, "connection refused"),
        Result(0, 0, 2 * MS, 200, b"infer;dur=abc", None),
    ]
    rep = results_report(results, measure_from_ns=0)
    assert rep.errors == {"HTTP 503": 1, "timeout": 1, "connection refused": 1}
    assert rep.latency["count"] == 2 and rep.latency["max_ms"] == 2
    assert rep.extra["server_timing"]["malformed"] == 1


def test_requests_are_http_1_1_with_keep_alive_and_a_length():
    target = URL.parse("http://127.0.0.1:8000/predict?x=1")
    reqs = build_requests(target, method="POST", bodies=[b'{"a":1}', b"{}"], headers=[("X-Key", "k")], content_type="application/json")
    assert len(reqs) == 2
    head, body = reqs[0].split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /predict?x=1 HTTP/1.1"
    assert b"Host: 127.0.0.1:8000" in head and b"Content-Length: 7" in head and b"X-Key: k" in head
    assert body == b'{"a":1}'


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"url": "ftp://x/"}, "malformed URL"),
        ({"url": "http://[::1"}, "malformed URL"),
        ({"url": "http://h/", "concurrency": [2], "rate": [10.0]}, "not both"),
        ({"url": "http://h/", "concurrency": [0]}, "concurrency must be"),
        ({"url": "http://h/", "rate": [-1.0]}, "rate must be"),
        ({"url": "http://h/", "duration_s": 0}, "duration must be > 0"),
        ({"url": "http://h/", "method": "GE T"}, "not an HTTP method"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        BenchOptions(**kwargs)


def test_a_body_makes_the_default_method_post():
    assert BenchOptions(url="http://h/", bodies=[b"{}"]).method == "POST"


def test_saturation_is_where_throughput_stops_and_latency_climbs():
    rows = [
        {"throughput_rps": 100, "p95_ms": 10, "mode": "concurrency", "level": 1},
        {"throughput_rps": 380, "p95_ms": 11, "mode": "concurrency", "level": 4},
        {"throughput_rps": 400, "p95_ms": 40, "mode": "concurrency", "level": 16},
    ]
    assert saturation(rows)["level"] == 4
    assert saturation(rows[:2]) is None


def test_html_is_self_contained_and_holds_the_numbers():
    rep = results_report(stalled_open_loop(), measure_from_ns=0, meta={"title": "t<script>"})
    page = render_html(rep, sweep=[{"mode": "rate", "level": 100, "throughput_rps": 99.0, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 300.0, "errors": 0}] * 2)
    assert page.startswith("<!doctype html>")
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert f"{rep.latency['p99_ms']:.0f} ms" in page
    assert "<svg" in page and "Throughput vs latency" in page


def test_the_report_says_when_the_generator_fell_behind_its_schedule():
    results = [Result(i * MS, i * MS, i * MS + MS, 200, None, None) for i in range(100)]
    on_time = results_report(results, measure_from_ns=0, lags_ns=[100_000] * 100)
    late = results_report(results, measure_from_ns=0, lags_ns=[100_000] * 90 + [8 * MS] * 10)
    assert on_time.extra["generator"]["behind"] is False
    assert late.extra["generator"]["behind"] is True and late.extra["generator"]["schedule_lag_p99_ms"] == 8.0


def test_behind_a_proxy_the_gap_is_named_for_it_and_replicas_are_counted():
    a = b'infer;dur=5, total;dur=6, replica;desc="a", upstream;desc="ray serve proxy"'
    b = b'infer;dur=5, total;dur=6, replica;desc="b", upstream;desc="ray serve proxy"'
    results = [Result(0, 0, 10 * MS, 200, a, None), Result(0, 0, 9 * MS, 200, a, None), Result(0, 0, 8 * MS, 200, b, None)]
    rep = results_report(results, measure_from_ns=0)
    assert NETWORK not in rep.stages
    assert rep.stages[PROXY]["mean_ms"] == pytest.approx(3.0)  # (4 + 3 + 2) / 3
    assert rep.extra["replicas"] == {"a": 2, "b": 1}


def test_the_live_line_merges_windows_and_counts_errors():
    from rich.console import Console

    from servescope.renderers.progress import BenchProgress

    with BenchProgress(Console(force_terminal=True, width=120), seconds=10, requests=None) as progress:
        progress.show("concurrency=4", 100, 1, [1.0] * 99)
        progress.show("concurrency=4", 300, 2, [2.0] * 150 + [9.0] * 48)
        [task] = progress.progress.tasks
    stats = task.fields["stats"]
    assert stats.startswith("300 req · ") and stats.endswith("p95 9.00 ms · errors 3")


@pytest.mark.parametrize("st", [b"a;dur=1e13", b"infer;dur=1e300, total;dur=1e300", b"db;dur=1e308, db;dur=1e308", b"a;dur=inf"])
def test_a_server_timing_value_out_of_range_is_malformed_and_the_run_goes_on(st):
    ok = b"infer;dur=1, total;dur=1.5"
    rep = results_report([Result(0, 0, 5 * MS, 200, st, None), Result(0, 0, 4 * MS, 200, ok, None)], measure_from_ns=0)
    assert rep.latency["count"] == 2  # both requests count: only the bad header is set aside
    assert rep.extra["server_timing"]["malformed"] == 1
    assert rep.stages["infer"]["count"] == 1 and rep.stages["infer"]["max_ms"] == 1


def response(*st_lines: bytes, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + extra
    head += b"".join(b"server-timing: " + line + b"\r\n" for line in st_lines)
    return head + b"\r\n{}"


def feed(data: bytes, **kw) -> tuple:
    """One response through the generator's connection, as the network would deliver it."""
    from servescope.load.loadgen import LoadGenerator, _Conn

    gen = LoadGenerator(URL.parse("http://127.0.0.1:1/"), [b"x"], **kw)
    conn = _Conn(gen)

    class Transport:
        def close(self):
            pass

    conn.transport = Transport()
    conn.cur = [0, 0]
    for i in range(0, len(data), 65536):  # in socket-sized pieces
        conn.data_received(data[i : i + 65536])
    [result] = gen.results
    return result


def test_server_timing_lines_are_joined_once_and_what_is_kept_is_capped():
    from servescope.load.loadgen import MAX_SERVER_TIMING_BYTES, OVERSIZED

    r = feed(response(b"a;dur=1", b"b;dur=2", b"total;dur=3"))
    assert r.server_timing == b"a;dur=1, b;dur=2, total;dur=3"
    # 20,000 lines (the old code rebuilt the joined value at each: quadratic), and one 1 MB line
    for data in (response(*[b"a;dur=0.001"] * 20_000), response(b"a;dur=0.001, " * 80_000 + b"b;dur=1")):
        r = feed(data)
        assert r.status == 200 and r.error is None  # the request itself is fine: measured as usual
        assert r.server_timing == OVERSIZED
    assert MAX_SERVER_TIMING_BYTES == 8192
    r = feed(response(b"a;dur=1" + b" " * 100), max_server_timing_bytes=64)
    assert r.server_timing == OVERSIZED
    rep = results_report([Result(0, 0, 5 * MS, 200, OVERSIZED, None)], measure_from_ns=0)
    assert rep.latency["count"] == 1
    assert rep.extra["server_timing"]["malformed"] == 1 and rep.extra["server_timing"]["too_large"] == 1


def test_a_result_is_a_named_record_that_pickles_and_old_tuples_still_read():
    import pickle

    from servescope.load.loadgen import error_kind, ok_latencies_ms

    r = feed(response(b"infer;dur=1"))
    assert type(r) is Result and r.status == 200 and r.error is None and r.server_timing == b"infer;dur=1"
    assert r.done_ns >= r.sent_ns >= r.scheduled_ns
    assert pickle.loads(pickle.dumps(r)) == r  # results come back from Ray generators pickled
    failed = Result(0, 0, MS, 0, None, "timeout")
    assert error_kind(failed) == "timeout" and error_kind(Result(0, 0, MS, 503, None, None)) == "HTTP 503"
    # open loop: latency counts from the schedule, even when the send was later
    assert ok_latencies_ms([Result(0, 2 * MS, 5 * MS, 200, None, None), failed]) == [5.0]
    as_tuples = [tuple(x) for x in stalled_open_loop()]
    old, new = results_report(as_tuples, measure_from_ns=0), results_report(stalled_open_loop(), measure_from_ns=0)
    assert old.latency == new.latency and old.extra == new.extra and old.latency["count"] == 300


def test_the_generator_reports_progress_since_what_was_already_shown():
    from servescope.load.loadgen import LoadGenerator

    gen = LoadGenerator(URL.parse("http://127.0.0.1:1/"), [b"x"])
    gen.results += [Result(0, 0, 2 * MS, 200, None, None), Result(0, 0, 1 * MS, 0, None, "timeout")]
    assert gen.progress_since(0) == (2, 1, [2.0])
    gen.results.append(Result(0, 0, 4 * MS, 200, None, None))
    assert gen.progress_since(2) == (3, 0, [4.0])


def test_an_endpoint_that_cannot_be_reached_is_an_endpoint_error_not_a_bad_setting():
    import socket

    from servescope.load.bench import run_bench

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match=rf"cannot reach http://127.0.0.1:{port}/predict: connection refused") as exc:
        run_bench(BenchOptions(url=f"http://127.0.0.1:{port}/predict", requests=1))
    assert not isinstance(exc.value, ConfigError)


def test_the_old_name_of_url_still_imports_with_a_warning():
    import servescope.load.loadgen as loadgen

    with pytest.warns(DeprecationWarning, match="now servescope.load.loadgen.URL"):
        assert loadgen.Target is URL


async def one_at_a_time_server(service_s: float):
    """An HTTP/1.1 server on 127.0.0.1 that answers one request at a time, ``service_s`` each
    (a busy worker): capacity 1 / service_s requests/s whatever the connections."""
    import asyncio

    lock = asyncio.Lock()

    async def handle(reader, writer):
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                async with lock:
                    await asyncio.sleep(service_s)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def overload(rate: float, duration_s: float, service_s: float, **kw) -> list[Result]:
    import asyncio

    from servescope.load.loadgen import LoadGenerator

    async def main():
        server, port = await one_at_a_time_server(service_s)
        async with server:
            gen = LoadGenerator(URL.parse(f"http://127.0.0.1:{port}/"), [b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"], **kw.pop("gen", {}))
            results = await gen.open_loop(rate=rate, duration_s=duration_s, **kw)
            return list(results)  # as open_loop returned them

    return asyncio.run(main())


def test_an_overloaded_open_loop_keeps_its_slowest_requests():
    # 30 requests due in 0.6 s on a server that serves 10/s: the last is answered ~3 s in, its
    # latency ~2.4 s; before, requests still in flight 2 s after the schedule ended were dropped
    results = overload(50, 0.6, 0.1)
    assert len(results) == 30 and all(r.error is None for r in results), [r.error for r in results]
    latencies = sorted((r.done_ns - r.scheduled_ns) / 1e9 for r in results)
    assert latencies[-1] > 2.0


def test_requests_due_that_waited_for_a_connection_are_still_sent_after_the_schedule():
    # one connection, 20 due in 0.5 s, 40 ms each: half still wait for the connection when the
    # schedule ends; they are sent then (not failed as "not sent"), their latency from their due time
    results = overload(40, 0.5, 0.04, gen={"max_connections": 1})
    assert len(results) == 20 and all(r.error is None for r in results), [r.error for r in results]
    assert max(r.sent_ns - r.scheduled_ns for r in results) > 0.2e9


def test_a_request_still_unanswered_after_the_drain_fails_as_unfinished():
    results = overload(50, 0.2, 0.1, drain_s=0.3)  # 10 due, 10/s: ~5 answered by the drain's end
    assert len(results) == 10
    errors = [r.error for r in results]
    # they are in the results when open_loop returns (before, they were appended later, if ever)
    assert 2 <= errors.count("unfinished at the end") <= 7 and set(errors) <= {None, "unfinished at the end"}, errors


def test_stop_during_the_drain_waits_two_seconds_at_most_and_leaves_the_rest_out():
    import asyncio

    from servescope.load.loadgen import STOP_DRAIN_S, LoadGenerator

    async def main():
        server, port = await one_at_a_time_server(0.5)
        async with server:
            gen = LoadGenerator(URL.parse(f"http://127.0.0.1:{port}/"), [b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"], timeout_s=30)
            run = asyncio.ensure_future(gen.open_loop(rate=40, duration_s=0.2))  # 8 due: 4 s of work
            await asyncio.sleep(0.5)  # the schedule is over: draining
            t0 = asyncio.get_running_loop().time()
            gen.stop()  # Ctrl-C
            results = list(await run)
            return results, asyncio.get_running_loop().time() - t0

    results, waited = asyncio.run(main())
    assert waited < STOP_DRAIN_S + 0.5
    assert 3 <= len(results) <= 6 and all(r.error is None for r in results), [r.error for r in results]


def _open_loop(rate: float, seconds: float, service_s: float, latency_s: float = 0.0, warmup_s: float = 1.0) -> list:
    """Requests due at ``rate`` from -warmup_s to ``seconds``, served one at a time every
    ``service_s`` (a queue), each also taking ``latency_s`` of its own after that."""
    from servescope.load.loadgen import Result

    out, free = [], -warmup_s
    k = 0
    while (due := -warmup_s + k / rate) < seconds:
        free = max(free, due) + service_s
        out.append(Result(round(due * 1e9), round(due * 1e9), round((free + latency_s) * 1e9), 200, None, None))
        k += 1
    return out


def test_throughput_above_capacity_is_the_capacity_not_the_offered_rate():
    # 40/s offered for 3 s to a server that completes 21.5/s: what it completed, not what was due
    results = _open_loop(40, 3.0, 1 / 21.5)
    rep = results_report(results, measure_from_ns=0, measure_until_ns=3 * 10**9, open_loop=True)
    assert rep.load.throughput_rps == pytest.approx(21.5, rel=0.05)
    assert rep.load.requests.measured == 120  # every request due in the window is still measured


def test_throughput_of_long_responses_below_capacity_is_the_offered_rate():
    # 10/s for 3 s, each answer 2 s long (a stream): not 30 requests over the 5 s to the last end
    results = _open_loop(10, 3.0, 0.0, latency_s=2.0, warmup_s=3.0)
    rep = results_report(results, measure_from_ns=0, measure_until_ns=3 * 10**9, open_loop=True)
    assert rep.load.throughput_rps == pytest.approx(10.0, rel=0.05)


def test_no_server_timing_hint_when_no_request_got_an_answer():
    from servescope.load.loadgen import Result

    refused = [Result(k * 10**6, k * 10**6, k * 10**6 + 1000, 0, None, "connection refused") for k in range(20)]
    rep = results_report(refused, measure_from_ns=0)
    assert rep.load.server_timing.hint is None  # the server never answered: its headers are unknown, not absent
    answered = [Result(k * 10**6, k * 10**6, k * 10**6 + 1000, 200, None, None) for k in range(20)]
    assert "sent no Server-Timing" in results_report(answered, measure_from_ns=0).load.server_timing.hint


def over_capacity(rate: float, service_ms: float, seconds: float) -> list[Result]:
    """An open loop at ``rate`` against a server that answers one request every ``service_ms``."""
    results, free_at = [], 0
    for k in range(int(rate * seconds)):
        sched = round(k * 1e9 / rate)
        done = max(sched, free_at) + round(service_ms * MS)
        free_at = done
        results.append(Result(sched, sched, done, 200, None, None))
    return results


def test_a_warm_up_backlog_above_capacity_is_said_and_none_below():
    from servescope.renderers.terminal import render_terminal

    # 100/s against a capacity of 50/s: by the end of a 1 s warm-up, ~50 requests are queued
    rep = results_report(over_capacity(100, 20.0, 3.0), measure_from_ns=1000 * MS, open_loop=True)
    backlog = rep.load.warmup_backlog
    assert backlog is not None and 40 <= backlog.requests <= 60 and backlog.oldest_ms >= 500
    out = render_terminal(rep)
    assert "still waiting when the measured window opened" in out and "--warmup 0s" in out
    # 1.5x its capacity: a third of the warm-up still queued
    assert results_report(over_capacity(75, 20.0, 3.0), measure_from_ns=1000 * MS, open_loop=True).load.warmup_backlog is not None
    # 20/s against the same server: nothing queued when the window opens
    assert results_report(over_capacity(20, 20.0, 3.0), measure_from_ns=1000 * MS, open_loop=True).load.warmup_backlog is None
    assert results_report(over_capacity(100, 20.0, 3.0), measure_from_ns=1000 * MS).load.warmup_backlog is None  # closed loop: none said


def test_closed_loop_throughput_is_the_work_done_in_the_window_without_a_warm_up():
    """c=4 of 525 ms answers for 12 s, measured from the first send: whole completions read 4%
    low (nothing ends in the first 525 ms); each answer's share of the window reads 4/0.525."""
    from servescope.load.results import completion_rate

    ms = 1_000_000
    results = []
    for slot in range(4):
        t = slot * 7 * ms  # the four connections a few ms apart, as they open
        while t < 12_500 * ms:
            results.append(Result(t, t, t + 525 * ms, 200, None, None))
            t += 525 * ms + 50_000  # 0.05 ms between an answer and the next send
    measured = [r for r in results if r.scheduled_ns < 12_000 * ms]
    ok = len(measured)
    rate, _ = completion_rate(results, measured, ok, 0, 12_000 * ms, closed=True)
    assert rate == pytest.approx(4 / 0.52505, rel=0.002)
    whole, _ = completion_rate(results, measured, ok, 0, 12_000 * ms)
    assert whole < 0.97 * 4 / 0.525  # what counting whole completions said


def test_an_open_loop_send_counts_from_its_due_time_only_when_the_generator_was_held_up():
    from servescope.load.loadgen import LATE_NS, counted_from

    assert counted_from(1_000_000_000, 1_000_300_000) is None  # 0.3 ms late: the timer's jitter, from the send
    assert counted_from(1_000_000_000, 999_900_000) is None  # woken early and sent at once
    assert counted_from(1_000_000_000, 1_000_000_000 + LATE_NS + 1) == 1_000_000_000  # held up: from when it was due


def test_the_progress_line_costs_the_loop_nothing_when_no_one_sees_it():
    from rich.console import Console

    from servescope.renderers.progress import BenchProgress

    class Untouchable:
        def progress_since(self, seen):
            raise AssertionError("read while the bar is off")

    with BenchProgress(Console(file=io.StringIO()), seconds=1.0, requests=None) as progress:
        progress.tick("concurrency=1", Untouchable())


def test_a_closed_loop_sends_exactly_its_requests_when_connections_close_together():
    # HTTP/1.0-style answers (the server closes each connection) to all requests in flight at
    # once: each closing connection reconnects, and before, each sent one more whatever the
    # count (10 requests at 4 callers came back as 12)
    import asyncio

    from servescope.load.loadgen import LoadGenerator

    async def main():
        tick = asyncio.Event()

        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            await tick.wait()
            writer.write(b"HTTP/1.0 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        async def ticker():
            while True:
                await asyncio.sleep(0.03)
                tick.set()  # every request in flight is answered now, together
                await asyncio.sleep(0)
                tick.clear()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        beat = asyncio.ensure_future(ticker())
        async with server:
            url = URL.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/")
            gen = LoadGenerator(url, [b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"], timeout_s=5)
            results = await asyncio.wait_for(gen.closed_loop(concurrency=4, requests=10), 20)
        beat.cancel()
        return results

    results = asyncio.run(main())
    assert len(results) == 10 and all(r.error is None for r in results), [r.error for r in results]
