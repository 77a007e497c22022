"""``servescope bench``: the load generator and what its results mean, one job beside
``doctor/`` and ``serve/``.

    loadgen.py      the open- and closed-loop generator (raw HTTP/1.1, asyncio)
    conn.py         one keep-alive connection: a request out, its answer read (httptools)
    wire.py         what it sends and keeps: the URL, raw requests, schedules, one Result per request
    bench.py        a run: levels, warm-up, one Report per level (``run_bench``)
    results.py      a level's results as a Report: stages, throughput, the ``load`` section
    cluster.py      generators on a Ray cluster, merged
    inputs.py       the bodies' order, latency by input size
    openai_api.py   OpenAI-compatible requests and their tokens
    workload.py     workloads in tokens (``--input-tokens``, ``--output-tokens``)
    streams.py      TTFT, ITL, TPOT of streamed answers
    slo.py          objectives and goodput
    sweep.py        a sweep's curve, its knee, ``--find-max``
    timeline.py     a run over time, where it stalled
    request_log.py  one row per request (``--csv``)
    telemetry.py    the server's own metrics over the window (``--scrape``), the GPUs': figures and sections
    known_metrics.py  the metric names of vLLM, TGI, Triton and servescope, in words
    sampler.py      the thread that scrapes them and reads NVML during the window

Their old places (``servescope.bench``, ``servescope.loadgen`` ...) still import, with a
DeprecationWarning, until the next release.
"""
