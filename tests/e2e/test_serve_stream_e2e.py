"""A model that yields, served by `servescope serve` on loopback: chunks reach a real client as
they are made, SSE on request, the whole breakdown in a trailer, batches share their steps (#15)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import httpx
import pytest

from servescope.load.bench import BenchOptions, run_bench

from .test_serve_e2e import start

pytestmark = pytest.mark.e2e
STEP_S = 0.05  # tests/e2e/endpoints/streaming_model.py


@pytest.fixture(scope="module")
def server():
    proc, url = start("--max-batch-size", "8", target="tests/e2e/endpoints/streaming_model.py:Steps")
    yield url
    proc.terminate()
    proc.communicate(timeout=30)


def stream(url: str, body: dict, headers: dict | None = None) -> tuple[httpx.Response, list[tuple[float, bytes]]]:
    """POST and read the answer's chunks as they arrive, each with its arrival time (s)."""
    t0 = time.perf_counter()
    chunks = []
    with httpx.stream("POST", f"{url}/predict", json=body, headers=headers, timeout=30) as r:
        for chunk in r.iter_raw():
            chunks.append((time.perf_counter() - t0, chunk))
    return r, chunks


def test_chunks_reach_the_client_as_the_model_makes_them(server):
    r, chunks = stream(server, {"n": 6})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = b"".join(c for _, c in chunks).splitlines()
    assert [json.loads(x) for x in lines] == [{"i": i} for i in range(6)]
    # six steps 50 ms apart: the first chunk arrives long before the last (not one buffered body)
    assert len(chunks) >= 4
    assert chunks[-1][0] - chunks[0][0] > 3 * STEP_S
    # the head's Server-Timing covers the time to the first chunk, not the whole stream
    head = dict(part.split(";dur=") for part in r.headers["server-timing"].split(", ") if ";dur=" in part)
    assert float(head["total"]) < 3 * STEP_S * 1000


def test_server_sent_events_when_the_client_asks_for_them(server):
    r, chunks = stream(server, {"n": 3}, {"Accept": "text/event-stream"})
    assert r.headers["content-type"] == "text/event-stream"
    events = [e for e in b"".join(c for _, c in chunks).split(b"\n\n") if e]
    assert [json.loads(e.removeprefix(b"data: ")) for e in events] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_a_client_that_accepts_trailers_gets_the_whole_breakdown_at_the_end(server):
    port = int(server.rsplit(":", 1)[1])
    body = b'{"n": 4}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /predict HTTP/1.1\r\nHost: t\r\nTE: trailers\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower() and b"trailer: server-timing" in head.lower()
    assert rest.endswith(b"\r\n\r\n")
    trailer = rest.rsplit(b"\r\n0\r\n", 1)[1].decode()
    assert trailer.lower().startswith("server-timing: ")
    stages = dict(part.split(";dur=") for part in trailer.split(": ", 1)[1].strip().split(", ") if ";dur=" in part)
    first = dict(part.split(";dur=") for part in head.decode().split("server-timing: ")[1].split("\r\n")[0].split(", ") if ";dur=" in part)
    assert float(stages["total"]) > float(first["total"]) + 2 * STEP_S * 1000  # the whole stream
    assert float(stages["infer"]) >= 3.5 * STEP_S * 1000  # four steps of the model


def test_concurrent_streams_share_the_models_steps_and_the_report_has_their_figures(server):
    before = json.loads(urllib.request.urlopen(f"{server}/report", timeout=10).read()).get("streaming") or {"responses": 0}
    results = []
    threads = [threading.Thread(target=lambda: results.append(stream(server, {"n": 5}))) for _ in range(4)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    took = time.perf_counter() - t
    assert len(results) == 4 and all(r.status_code == 200 for r, _ in results)
    # one by one would be 4 x 5 steps = 1 s; sharing steps, about two batches' worth
    assert took < 4 * 5 * STEP_S * 0.8
    time.sleep(1.2)  # /report is rebuilt at most once a second
    after = json.loads(urllib.request.urlopen(f"{server}/report", timeout=10).read())["streaming"]
    assert after["responses"] - before["responses"] == 4
    assert 0.8 * STEP_S * 1000 < after["chunk_gap"]["p50_ms"] < 3 * STEP_S * 1000
    metrics = urllib.request.urlopen(f"{server}/metrics", timeout=10).read().decode()
    assert "servescope_time_to_first_chunk_seconds_count" in metrics and "servescope_chunk_gap_seconds_bucket" in metrics


def test_bench_reads_the_stream_the_server_says_it_sent(server):
    (rep,) = run_bench(BenchOptions(url=f"{server}/predict", bodies=[b'{"n": 5}'], concurrency=[2], duration_s=2.0, warmup_s=0.3))
    stream_ = rep.load.stream
    assert stream_ is not None and stream_.responses >= 4
    # each step 50 ms on the one worker: a token every step when one stream is live, every two
    # steps when both are (which depends on when the closed loop's requests end and start)
    assert 0.8 * STEP_S * 1000 < stream_.itl["p50_ms"] < 2.6 * STEP_S * 1000
    # and neither waits for the other's whole generation before its first token
    assert stream_.ttft["p99_ms"] < 4 * STEP_S * 1000
    assert rep.errors == {}


def test_bench_asking_for_trailers_counts_the_stream_once(server):
    # the trailer's whole-stream breakdown is not added to the head's: shares stay a breakdown
    (rep,) = run_bench(BenchOptions(url=f"{server}/predict", bodies=[b'{"n": 4}'], headers=[("TE", "trailers")],
                                    concurrency=[1], duration_s=1.5, warmup_s=0.2))  # fmt: skip
    assert not rep.errors
    shares = {name: s["share"] for name, s in rep.stages.items()}
    assert sum(shares.values()) < 1.05, shares
    assert shares["stream_after_head"] > 0.5 and shares["infer"] < 0.4  # 3 of the 4 steps come after the head


def test_a_request_that_comes_while_another_streams_starts_at_once(server):
    """Streams advance a step at a time between batches: a late request's first token does not
    wait for the running generation to end (static batching would make it wait 20 steps)."""
    done = []
    long_ = threading.Thread(target=lambda: done.append(stream(server, {"n": 20})))
    long_.start()
    time.sleep(5 * STEP_S)
    r, chunks = stream(server, {"n": 2})
    long_.join(30)
    assert r.status_code == 200 and done and done[0][0].status_code == 200
    assert chunks[0][0] < 5 * STEP_S  # about two steps (one of each stream), not the 15 left of the long one
