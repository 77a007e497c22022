from __future__ import annotations

import threading

from servescope import Distribution, Recorder


def test_recording_from_many_threads_loses_nothing():
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


def test_failed_requests_count_but_stay_out_of_latency():
    rec = Recorder()
    rec.record_durations({"infer": 2.0}, 3.0)
    rec.record_durations({}, 50.0, error="HTTP 503")
    assert len(rec) == 2 and len(rec.latency) == 1 and rec.errors == {"HTTP 503": 1}
    assert rec.first_ms == 3.0
