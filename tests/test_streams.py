"""Streamed responses: what the load generator keeps of each chunk or event, and the figures
made of it (TTFT, ITL with its coordinated-omission correction, combining), on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from servescope.load import loadgen
from servescope.load.bench import results_report
from servescope.load.loadgen import CHUNKED, SSE, LoadGenerator, Result, URL
from servescope.report import Report
from servescope.load.streams import Streamed, overdue, stream_stats

MS = 1_000_000


class FakeTransport:
    def write(self, data):
        pass

    def close(self):
        pass


@pytest.fixture
def clock(monkeypatch):
    """perf_counter_ns as the test sets it."""
    now = [0]
    monkeypatch.setattr(loadgen.time, "perf_counter_ns", lambda: now[0])
    return now


def conn_receiving(pieces, clock):
    """A connection that sent one request at t=0 and read ``pieces`` at (ms, bytes)."""
    gen = LoadGenerator(URL.parse("http://127.0.0.1:1/"), [b"GET / HTTP/1.1\r\n\r\n"])
    conn = loadgen._Conn(gen)
    conn.connection_made(FakeTransport())
    gen.in_flight = 1
    conn.send(b"", [None, 0])
    for at_ms, data in pieces:
        clock[0] = at_ms * MS
        conn.data_received(data)
    return gen.results


def test_each_chunk_of_a_chunked_response_is_timed_when_it_arrives(clock):
    [r] = conn_receiving(
        [
            (2, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            (100, b"4\r\ntok0\r\n"),
            (120, b"4\r\ntok1\r\n4\r\nto"),  # the third chunk starts here: it arrived at 120
            (140, b"k2\r\n0\r\n\r\n"),
        ],
        clock,
    )
    assert r.status == 200 and r.error is None
    assert r.stream == (CHUNKED, 2 * MS, [100 * MS, 120 * MS, 120 * MS])


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_sse_counts_events_with_data_wherever_the_reads_split_them(clock):
    [r] = conn_receiving(
        [
            (1, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"),
            (50, chunk(b": a comment, not an event\r\n\r\n")),  # a blank line ends it: no data, no event
            (100, chunk(b"data: tok0\r\n\r\n")),
            (130, chunk(b"data: to")),  # half an event
            (150, chunk(b"k1\n\nd")),  # LF line ends too; the event ends here, and a third begins
            (170, chunk(b'ata: {"x": 1}\r\n\r\n') + b"0\r\n\r\n"),
        ],
        clock,
    )
    assert r.stream == (SSE, 1 * MS, [100 * MS, 150 * MS, 170 * MS])


def test_an_openai_stream_end_marker_is_not_a_token(clock):
    [r] = conn_receiving(
        [
            (1, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"),
            (100, chunk(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')),
            (120, chunk(b"data: [DO")),  # the marker split across reads
            (125, chunk(b"NE]\n\n") + b"0\r\n\r\n"),
        ],
        clock,
    )
    assert r.stream == (SSE, 1 * MS, [100 * MS])


def test_a_plain_response_keeps_no_stream(clock):
    [r] = conn_receiving([(5, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")], clock)
    assert r.stream is None and r.done_ns == 5 * MS
    # raw ASGI apps chunk every answer: one chunk is a plain response
    [r] = conn_receiving([(5, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"{}") + b"0\r\n\r\n")], clock)
    assert r.stream is None and r.status == 200


def test_ttft_counts_from_the_schedule_and_gaps_from_token_to_token():
    # scheduled at 0, sent 30 ms late (open loop): TTFT from the schedule
    streams = [Streamed(0, SSE, 35 * MS, [100 * MS, 120 * MS, 140 * MS]), Streamed(0, SSE, 5 * MS, [50 * MS, 60 * MS])]
    section, gaps = stream_stats(streams, open_loop=False, window_s=2.0)
    assert section.ttft["count"] == 2 and section.ttft["max_ms"] == 100.0 and section.ttft["p50_ms"] == 75.0
    assert section.ttfb["max_ms"] == 35.0
    assert sorted(np.concatenate(gaps).tolist()) == [10.0, 20.0, 20.0]
    assert section.tpot["max_ms"] == 20.0 and section.tpot["p50_ms"] == 15.0
    assert section.chunks == 5 and section.chunks_per_s == 2.5
    assert section.itl_corrected is None  # closed loop: nothing corrected


def test_open_loop_counts_the_tokens_overdue_during_a_stall():
    assert overdue(np.array([20.0, 35.0, 100.0]), 20.0).tolist() == [80.0, 60.0, 40.0, 20.0]
    # 99 gaps of 20 ms and one of 1 s: one gap in a hundred; the 49 tokens overdue during it count
    times = np.cumsum([0] + [20 * MS] * 50 + [1000 * MS] + [20 * MS] * 49).tolist()
    section, gaps = stream_stats([Streamed(0, CHUNKED, 0, times)], open_loop=True, window_s=10)
    assert section.itl_expected_ms == 20.0
    # the headline is the gaps as observed, each once (vLLM's ITL, what the server says) ...
    assert section.itl["count"] == 100 and section.itl["p95_ms"] == 20.0
    # ... and beside it, the tokens overdue during the stall counted
    assert section.itl_corrected["count"] == 100 + 49
    assert section.itl_corrected["p95_ms"] > 500  # the stall shows where a user would see it
    assert gaps[0].size == 149


def test_results_report_adds_the_stream_section_only_for_streamed_responses():
    plain = Result(0, 0, 10 * MS, 200, None, None)
    one_chunk = Result(0, 0, 10 * MS, 200, None, None, (CHUNKED, 1 * MS, [9 * MS]))  # raw ASGI: every answer chunked
    assert results_report([plain, one_chunk], measure_from_ns=0).load.stream is None
    streamed = Result(0, 0, 60 * MS, 200, None, None, (SSE, 1 * MS, [20 * MS, 40 * MS, 60 * MS]))
    rep = results_report([plain, streamed], measure_from_ns=0)
    assert rep.load.stream.responses == 1 and rep.load.stream.ttft["p50_ms"] == 20.0


def test_reports_combine_by_merging_stream_distributions_never_percentiles():
    a = results_report([Result(0, 0, 60 * MS, 200, None, None, (SSE, 0, [10 * MS, 20 * MS, 30 * MS]))], measure_from_ns=0)
    b = results_report([Result(0, 0, 60 * MS, 200, None, None, (SSE, 0, [40 * MS, 90 * MS]))], measure_from_ns=0)
    again = Report.from_json(Report.combine([Report.from_json(a.to_json()), b]).to_json())
    st = again.load.stream
    assert st.responses == 2 and st.chunks == 5
    assert st.ttft["count"] == 2 and st.ttft["max_ms"] == 40.0
    assert st.itl["count"] == 3 and st.itl["p50_ms"] == 10.0 and st.itl["max_ms"] == 50.0  # 10, 10, 50: the median of all gaps
    assert "load.stream.chunks_per_s" in again.meta["not_combined"]


def test_tokens_that_come_in_one_burst_have_no_rate_per_request():
    from servescope.sections import Stream
    from servescope.stats import Distribution

    def tpot(values):
        d = Distribution()
        d.extend(values)
        return {"tpot": d}

    burst = Stream.from_distributions(tpot([0.008, 0.01, 0.02]))
    paced = Stream.from_distributions(tpot([20.0, 20.0, 25.0]))
    assert burst.chunks_per_s_per_request is None  # not "125,000 tokens/s per request"
    assert paced.chunks_per_s_per_request == 50.0
