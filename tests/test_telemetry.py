"""bench --scrape and the GPUs: Prometheus texts as vLLM, TGI, Triton and servescope write
them, summarised over a window (figures checked against hand-computed values), scrapes that
fail, and NVML through a stand-in module (no GPU here). No clock, no sleep: the sampler runs
on a fake clock whose every reading is one second later."""

from __future__ import annotations

import sys
import types
import urllib.error

import pytest

from servescope.exceptions import ConfigError
from servescope.load.sampler import Sampler
from servescope.load.telemetry import MAX_SERIES, MetricsWindow, bucket_quantile, parse_metrics
from servescope.report import Report
from servescope.sections import Load

S = 1_000_000_000
MODEL = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'


def vllm(running, waiting, kv, prompt, generated, ttft, ttft_sum, finished=None):
    """A vLLM /metrics text (as its prometheus_client writes it: counters with _total, and
    the client's _created gauges); ``ttft``: cumulative counts for le 0.1, 0.25, 0.5, +Inf."""
    b = dict(zip(("0.1", "0.25", "0.5", "+Inf"), ttft))
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{MODEL}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{MODEL}}} {waiting}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{MODEL}}} {kv}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{MODEL}}} {prompt}",
        "# TYPE vllm:prompt_tokens_created gauge",
        f"vllm:prompt_tokens_created{{{MODEL}}} 1.7e9",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{MODEL}}} {generated}",
        "# TYPE vllm:request_success_total counter",
        *([f'vllm:request_success_total{{{MODEL},finished_reason="length"}} {finished}'] if finished is not None else []),
        "# TYPE vllm:time_to_first_token_seconds histogram",
        *(f'vllm:time_to_first_token_seconds_bucket{{{MODEL},le="{le}"}} {n}' for le, n in b.items()),
        f"vllm:time_to_first_token_seconds_count{{{MODEL}}} {ttft[-1]}",
        f"vllm:time_to_first_token_seconds_sum{{{MODEL}}} {ttft_sum}",
        "# TYPE vllm:time_to_first_token_seconds_created gauge",
        f"vllm:time_to_first_token_seconds_created{{{MODEL}}} 1.7e9",
        "# TYPE my_own_gauge gauge",
        "my_own_gauge 7",
    ]
    return "\n".join(lines) + "\n"


VLLM = [  # at 0 s, 5 s and 10 s of the window
    vllm(0, 0, 0.10, 1000, 5000, (10, 20, 30, 30), 4.5),
    vllm(4, 2, 0.40, 1500, 7000, (10, 30, 40, 40), 7.0, finished=5),
    vllm(2, 0, 0.25, 2000, 9000, (10, 50, 70, 70), 13.5, finished=12),
]


def window(texts, step_s=5.0):
    w = MetricsWindow()
    for i, text in enumerate(texts):
        w.add(round(i * step_s * S), text)
    return w.summary(url="http://127.0.0.1:8000/metrics", interval_s=1.0)


def series(section, name, **labels):
    [s] = [s for s in section.series if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return s


def test_vllm_gauges_counters_and_histograms_over_the_window():
    m = window(VLLM)
    assert m.servers == ["vllm"] and m.scrapes == 3 and m.failed == 0 and m.window_s == 10.0
    running = series(m, "vllm:num_requests_running")
    assert (running.value.min, running.value.mean, running.value.max) == (0, 2, 4)
    assert running.labels == {"engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    assert running.label == "requests running" and running.server == "vllm"
    kv = series(m, "vllm:kv_cache_usage_perc").value
    assert (kv.min, kv.mean, kv.max) == (0.1, 0.25, 0.4)
    waiting = series(m, "vllm:num_requests_waiting").value
    assert waiting.mean == pytest.approx(2 / 3)
    generated = series(m, "vllm:generation_tokens_total")
    assert (generated.increase, generated.per_s) == (4000, 400)
    assert series(m, "vllm:prompt_tokens_total").increase == 1000
    # first seen in the window's second scrape: created during it, counted from zero
    assert series(m, "vllm:request_success_total", finished_reason="length").increase == 12
    ttft = series(m, "vllm:time_to_first_token_seconds")
    # the window's increments: 0 in (0, 0.1], 30 in (0.1, 0.25], 10 in (0.25, 0.5]; sum 9.0 s over 40
    assert ttft.count == 40 and ttft.mean == 0.225
    assert ttft.buckets == {"0.1": 0, "0.25": 30, "0.5": 40, "+Inf": 40}
    assert ttft.p50 == pytest.approx(0.1 + 0.15 * 20 / 30)  # rank 20 of 40, inside the second bucket
    assert ttft.p90 == pytest.approx(0.25 + 0.25 * 6 / 10)
    assert ttft.p99 == pytest.approx(0.25 + 0.25 * 9.6 / 10)
    assert ttft.over_top == 0
    names = [s.name for s in m.series]
    assert not any(n.endswith("_created") for n in names)  # the client library's timestamps
    assert names[-1] == "my_own_gauge" and series(m, "my_own_gauge").server is None  # kept, after the known ones


def test_a_counter_reset_counts_from_zero_and_nan_gauges_say_so():
    texts = [f"# TYPE tgi_request_count counter\ntgi_request_count {v}\n# TYPE tgi_queue_size gauge\ntgi_queue_size NaN\n" for v in (100, 10, 30)]
    m = window(texts)
    assert series(m, "tgi_request_count").increase == 30  # 0 (100 -> reset), then 10, then 20
    assert series(m, "tgi_queue_size").value is None


TGI = [
    """# TYPE tgi_request_count counter
tgi_request_count 10
# TYPE tgi_queue_size gauge
tgi_queue_size 0
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 1
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 5
tgi_request_duration_bucket{le="1"} 10
tgi_request_duration_bucket{le="+Inf"} 10
tgi_request_duration_sum 6
tgi_request_duration_count 10
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="prefill",le="0.01"} 10
tgi_batch_inference_duration_bucket{method="prefill",le="0.1"} 10
tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} 10
tgi_batch_inference_duration_sum{method="prefill"} 0.05
tgi_batch_inference_duration_count{method="prefill"} 10
tgi_batch_inference_duration_bucket{method="decode",le="0.01"} 0
tgi_batch_inference_duration_bucket{method="decode",le="0.1"} 100
tgi_batch_inference_duration_bucket{method="decode",le="+Inf"} 100
tgi_batch_inference_duration_sum{method="decode"} 3
tgi_batch_inference_duration_count{method="decode"} 100
""",
    """# TYPE tgi_request_count counter
tgi_request_count 30
# TYPE tgi_queue_size gauge
tgi_queue_size 6
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 5
tgi_request_duration_bucket{le="1"} 20
tgi_request_duration_bucket{le="+Inf"} 30
tgi_request_duration_sum 36
tgi_request_duration_count 30
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="prefill",le="0.01"} 20
tgi_batch_inference_duration_bucket{method="prefill",le="0.1"} 30
tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} 30
tgi_batch_inference_duration_sum{method="prefill"} 0.75
tgi_batch_inference_duration_count{method="prefill"} 30
tgi_batch_inference_duration_bucket{method="decode",le="0.01"} 0
tgi_batch_inference_duration_bucket{method="decode",le="0.1"} 500
tgi_batch_inference_duration_bucket{method="decode",le="+Inf"} 500
tgi_batch_inference_duration_sum{method="decode"} 15
tgi_batch_inference_duration_count{method="decode"} 500
""",
]


def test_tgi_counters_without_total_and_histograms_by_label():
    m = window(TGI, step_s=10)
    assert m.servers == ["tgi"]
    count = series(m, "tgi_request_count")  # TGI writes its counters without _total
    assert (count.increase, count.per_s) == (20, 2)
    assert series(m, "tgi_batch_current_size").value.max == 8
    duration = series(m, "tgi_request_duration")
    # increments: 0 in (0, 0.5], 10 in (0.5, 1], 10 above 1 s: half of them over the top bucket
    assert duration.count == 20 and duration.mean == 1.5
    assert duration.p50 == pytest.approx(1.0)  # rank 10: the top of (0.5, 1]
    assert duration.p99 == 1.0 and duration.over_top == 10  # above the highest bound: that bound
    prefill, decode = series(m, "tgi_batch_inference_duration", method="prefill"), series(m, "tgi_batch_inference_duration", method="decode")
    assert prefill.count == 20 and prefill.mean == pytest.approx(0.035)
    assert prefill.p50 == pytest.approx(0.01 * 10 / 10)  # rank 10 of 20: the first bucket (from 0) holds 10
    assert decode.count == 400 and decode.mean == pytest.approx(0.03)
    assert decode.p50 == pytest.approx(0.01 + 0.09 * 200 / 400)


def triton(ok, queue_us, infer_us, util, used):
    labels = 'model="resnet50",version="1"'
    return f"""# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{{labels}}} {ok}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{{labels}}} {queue_us}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{{labels}}} {infer_us}
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="GPU-0"}} {util}
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{{gpu_uuid="GPU-0"}} {used}
"""


def test_triton_per_request_queue_and_compute_time():
    m = window([triton(100, 50_000, 1_000_000, 0.5, 2e9), triton(300, 250_000, 3_000_000, 0.9, 4e9)], step_s=10)
    assert m.servers == ["triton"]
    ok = series(m, "nv_inference_request_success")  # as Triton writes it: no _total
    assert (ok.increase, ok.per_s) == (200, 20)
    queue = series(m, "nv_inference_queue_duration_us", model="resnet50")
    assert queue.per_request == 1000  # 200,000 us over 200 requests: 1 ms each
    assert series(m, "nv_inference_compute_infer_duration_us").per_request == 10_000
    util = series(m, "nv_gpu_utilization").value
    assert (util.min, util.mean, util.max) == (0.5, 0.7, 0.9)
    assert series(m, "nv_gpu_memory_used_bytes").value.mean == 3e9


def test_servescope_own_metrics_as_its_exporter_writes_them():
    from servescope.exporters import PrometheusExporter

    exporter = PrometheusExporter()
    for _ in range(5):  # before the window
        exporter.observe({"infer": 4_000_000}, 5_000_000, 200)
    texts = [exporter.exposition()[0].decode()]
    for _ in range(10):  # in it: 20 ms each, 18 in infer
        exporter.observe({"infer": 18_000_000}, 20_000_000, 200)
    exporter.observe({}, None, 503)
    texts.append(exporter.exposition()[0].decode())
    m = window(texts, step_s=2)
    assert m.servers == ["servescope"]
    request = series(m, "servescope_request_seconds")
    assert request.count == 10 and request.mean == pytest.approx(0.020)  # the mean is exact
    assert request.p50 == pytest.approx(0.01 + 0.015 * 5 / 10)  # every one in (0.01, 0.025]: an estimate
    assert series(m, "servescope_stage_seconds", stage="infer").count == 10
    assert series(m, "servescope_requests_total", status="200").increase == 10
    assert series(m, "servescope_requests_total", status="503").increase == 1  # created in the window


def test_bucket_quantile_edges():
    assert bucket_quantile(0.5, {}) is None
    assert bucket_quantile(0.5, {"1": 3}) is None  # no +Inf bucket
    assert bucket_quantile(0.5, {"1": 0, "+Inf": 0}) is None  # no observation
    assert bucket_quantile(0.5, {"1": 0, "+Inf": 4}) == 1.0  # all above the top bucket
    assert bucket_quantile(0.5, {"0": 4, "+Inf": 4}) == 0.0
    assert bucket_quantile(0.25, {"2": 4, "+Inf": 4}) == 0.5  # the first bucket from 0


def test_series_are_bounded_with_known_ones_first():
    text = "".join(f"# TYPE other_{i} gauge\nother_{i} {i}\n" for i in range(MAX_SERIES + 50)) + "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
    m = window([text, text])
    assert len(m.series) == MAX_SERIES and m.left_out == 51
    assert m.series[0].name == "tgi_queue_size"


def test_unparsable_text_is_a_value_error():
    with pytest.raises(ValueError):
        parse_metrics("<html><body>Not found</body></html>")


# -- the sampler --------------------------------------------------------------------------------
class FakeClock:
    """Each reading one second after the last, so the sampler never waits."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        self.t += S
        return self.t


def scripted(answers):
    """A fetch that answers each call with the next of ``answers`` (text, or an exception)."""
    answers = list(answers)

    def fetch(url, timeout_s):
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer.encode()

    return fetch


def run_window(sampler, until_s):
    sampler.open()
    sampler.start(0, round(until_s * S))
    out = sampler.stop()
    sampler.close()
    return out


def test_sampler_scrapes_at_the_window_start_and_end_and_counts_failures():
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    fetch = scripted([VLLM[0], VLLM[0], refused, VLLM[2]])  # the check, the window's start, a failure, its end
    metrics, gpu = run_window(Sampler(scrape="http://127.0.0.1:8000/metrics", gpu=False, fetch=fetch, clock=FakeClock()), until_s=8)
    assert gpu is None
    assert metrics.scrapes == 2 and metrics.failed == 1 and metrics.first_error == "connection refused"
    # each scrape is dated mid-request: 2.5 s and 10.5 s on the fake clock (one second a reading)
    assert metrics.window_s == 8.0
    assert series(metrics, "vllm:generation_tokens_total").increase == 4000


def test_a_scrape_of_html_or_an_error_status_is_counted_with_its_reason():
    not_found = urllib.error.HTTPError("http://x/metrics", 404, "Not Found", {}, None)
    fetch = scripted([VLLM[0], VLLM[0], "<html>oops</html>", not_found, VLLM[1]])
    metrics, _ = run_window(Sampler(scrape="http://127.0.0.1:8000/metrics", gpu=False, fetch=fetch, clock=FakeClock()), until_s=12)
    assert metrics.failed == 2 and metrics.scrapes == 2
    assert metrics.first_error == "not Prometheus metrics (invalid metric name:<html>oops</html>)"  # the earlier one


@pytest.mark.parametrize(
    "answer, said",
    [
        (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), "could not be read (connection refused)"),
        (urllib.error.HTTPError("http://x/metrics", 404, "Not Found", {}, None), "could not be read (HTTP 404)"),
        (TimeoutError("timed out"), "could not be read (no answer within 5s)"),
        ("<html>Not found</html>", "not Prometheus metrics"),
        ("", "not Prometheus metrics (an empty answer)"),
    ],
)
def test_a_scrape_url_that_fails_before_the_load_is_a_config_error(answer, said):
    sampler = Sampler(scrape="http://127.0.0.1:8000/metrics", gpu=False, fetch=scripted([answer]))
    with pytest.raises(ConfigError, match="no request was sent") as err:
        sampler.open()
    assert said in str(err.value) and "\n" not in str(err.value)


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="--scrape: malformed URL"):
        Sampler(scrape="localhost:8000/metrics")
    with pytest.raises(ConfigError, match="at least 100ms"):
        Sampler(scrape="http://127.0.0.1:8000/metrics", interval_s=0.01)


def test_without_prometheus_client_scrape_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'servescope\[prometheus\]'"):
        Sampler(scrape="http://127.0.0.1:8000/metrics")


# -- GPUs through a stand-in NVML -----------------------------------------------------------------
class NVMLError(Exception):
    pass


def fake_nvml(*, init_error=None, devices=1, util=(20, 80, 50, 50), used_gib=(1, 2, 3, 2), no_util=False):
    """A ``pynvml`` stand-in: each device's readings go through ``util`` and ``used_gib`` in turn."""
    nv = types.ModuleType("pynvml")
    calls = {"util": 0, "memory": 0, "shutdown": 0}

    def init():
        if init_error:
            raise NVMLError(init_error)

    def utilization(handle):
        if no_util:
            raise NVMLError("Not Supported")
        i = calls["util"] // devices % len(util)
        calls["util"] += 1
        return types.SimpleNamespace(gpu=util[i] + handle, memory=util[i] / 2)

    def memory(handle):
        i = calls["memory"] // devices % len(used_gib)
        calls["memory"] += 1
        return types.SimpleNamespace(used=used_gib[i] * 2**30, total=80 * 2**30, free=0)

    nv.NVMLError = NVMLError
    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: devices
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # older pynvml: bytes
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlDeviceGetUtilizationRates = utilization
    nv.nvmlDeviceGetMemoryInfo = memory
    nv.calls = calls
    return nv


def test_gpus_sampled_over_the_window_through_nvml(monkeypatch):
    nv = fake_nvml(devices=2)
    monkeypatch.setitem(sys.modules, "pynvml", nv)  # what `import pynvml` finds
    sampler = Sampler(gpu=True, clock=FakeClock())
    metrics, gpu = run_window(sampler, until_s=6)  # samples at the start, 3 s, 5 s and the end
    assert metrics is None and gpu.samples == 4 and gpu.failed == 0 and gpu.driver == "550.54.15"
    d0, d1 = gpu.devices
    assert (d0.name, d0.uuid, d1.uuid) == ("NVIDIA H100 80GB HBM3", "GPU-0", "GPU-1")
    assert (d0.utilization_pct.min, d0.utilization_pct.mean, d0.utilization_pct.max) == (20, 50, 80)
    assert (d1.utilization_pct.min, d1.utilization_pct.max) == (21, 81)  # the stand-in's second device: +1
    assert d0.memory_utilization_pct.mean == 25
    assert (d0.memory_used_bytes.min, d0.memory_used_bytes.mean, d0.memory_used_bytes.max) == (2**30, 2 * 2**30, 3 * 2**30)
    assert d0.memory_total_bytes == 80 * 2**30 and d0.samples == 4
    assert nv.calls["shutdown"] == 1


def test_nvml_that_does_not_start_is_no_gpu_and_no_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="NVML Shared Library Not Found"))
    sampler = Sampler(gpu=True)
    sampler.open()
    assert not sampler.active
    assert sampler.gpu_note == "none seen: NVML did not start (NVML Shared Library Not Found)"
    sampler.start(0, S)
    assert sampler.stop() == (None, None)
    sampler.close()


def test_no_nvidia_ml_py_and_no_device_are_said_in_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    sampler = Sampler(gpu=True)
    sampler.open()
    assert not sampler.active and "nvidia-ml-py is not installed" in sampler.gpu_note
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices=0))
    sampler = Sampler(gpu=True)
    sampler.open()
    assert sampler.gpu_note == "none seen: NVML found no GPU"


def test_a_gpu_that_does_not_say_its_utilization_keeps_its_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(no_util=True))
    _, gpu = run_window(Sampler(gpu=True, clock=FakeClock()), until_s=2)
    [d] = gpu.devices
    assert d.utilization_pct is None and d.memory_used_bytes.max == 2**30 * 2
    assert gpu.failed == gpu.samples == 2 and gpu.first_error == "GPU 0: utilization: Not Supported"


def test_no_gpu_switch_does_not_touch_nvml(monkeypatch):
    nv = fake_nvml(init_error="must not be called")
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = Sampler(gpu=False)
    sampler.open()
    assert not sampler.active and sampler.gpu_note == ""


# -- in the report ----------------------------------------------------------------------------------
def report_with_telemetry(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    fetch = scripted([VLLM[0], *VLLM])  # the check, then the window's three scrapes
    metrics, gpu = run_window(Sampler(scrape="http://127.0.0.1:8000/metrics", fetch=fetch, clock=FakeClock()), until_s=6)
    rep = Report(latency={"count": 0}, stages={}, meta={"target": "http://127.0.0.1:8000/v1/completions"})
    rep.load = Load(server_metrics=metrics, gpu=gpu)
    return rep


def test_json_round_trip_keeps_every_figure(monkeypatch):
    rep = report_with_telemetry(monkeypatch)
    again = Report.from_json(rep.to_json())
    assert again.load.server_metrics == rep.load.server_metrics and again.load.gpu == rep.load.gpu
    data = again.to_dict()["load"]
    assert data["server_metrics"]["series"][0]["name"] == "vllm:num_requests_running"
    assert data["gpu"]["devices"][0]["utilization_pct"] == {"min": 20.0, "mean": 50.0, "max": 80.0}


def test_terminal_and_html_show_the_known_series_and_the_gpus(monkeypatch):
    from servescope.renderers.html import render_html
    from servescope.renderers.terminal import render_terminal

    rep = report_with_telemetry(monkeypatch)
    text = render_terminal(rep, width=160)
    assert "Server's own metrics (vllm, scraped every 1 s, 3 scrapes over 8.0 s)" in text
    assert "requests running" in text and "+4,000 tokens" in text
    assert "p50 ≈ 200 ms · p99 ≈ 490 ms · mean 225 ms (40 observations)" in text
    assert "≈: estimated from the histogram's buckets" in text
    assert "GPU 0 NVIDIA H100 80GB HBM3: utilization min 20% · mean 50% · max 80%" in text
    assert 'every series below: {engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}' in text
    assert 'vllm:request_success_total{finished_reason="length"}' in text  # the labels that differ, on the row
    assert "my_own_gauge" not in text and "1 series servescope does not know is in the JSON" in text
    page = render_html(rep)
    assert "Server&#x27;s own metrics (vllm" in page and "vllm:kv_cache_usage_perc" in page and "NVIDIA H100" in page


def test_report_of_a_run_without_telemetry_shows_nothing_of_it():
    from servescope.renderers.terminal import render_terminal

    rep = Report(latency={"count": 0}, stages={}, meta={"gpu": "none seen: NVML found no GPU"})
    rep.load = Load()
    assert "Server's own metrics" not in render_terminal(rep) and "GPU" not in render_terminal(rep)


# -- the command line -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, said",
    [
        (["--scrape-interval", "10ms"], "at least 100ms"),
        (["--scrape", "metrics"], "--scrape: malformed URL"),
        (["--scrape", "http://127.0.0.1:9/metrics", "--ray"], "--scrape is not supported with --ray"),
    ],
)
def test_bad_scrape_options_are_one_line_and_exit_2(args, said, capsys):
    from servescope.cli import main

    assert main(["bench", "http://127.0.0.1:9/predict", *args]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_ctrl_c_ends_the_window_with_a_last_scrape_at_once():
    sampler = Sampler(scrape="http://127.0.0.1:8000/metrics", gpu=False, clock=FakeClock())
    texts = iter([VLLM[0], VLLM[0], VLLM[1], VLLM[2]])

    def fetch(url, timeout_s):
        text = next(texts)
        if text is VLLM[1]:
            sampler.end()  # Ctrl-C while this scrape is under way
        return text.encode()

    sampler._fetch = fetch
    metrics, _ = run_window(sampler, until_s=600)  # planned to go on for ten minutes
    assert metrics.scrapes == 3 and metrics.window_s < 20
    assert series(metrics, "vllm:generation_tokens_total").increase == 4000  # up to the last scrape, taken at once


def test_a_summary_gives_its_count_and_mean_and_its_quantiles_as_gauges():
    def summary(count, total, p50):
        return (f'# TYPE rpc_seconds summary\nrpc_seconds{{quantile="0.5"}} {p50}\n'
                f"rpc_seconds_count {count}\nrpc_seconds_sum {total}\n")

    m = window([summary(10, 1.0, 0.1), summary(30, 5.0, 0.3)])
    [counts] = [s for s in m.series if s.type == "summary"]
    assert (counts.count, counts.mean, counts.p50) == (20, 0.2, None)
    assert series(m, "rpc_seconds", quantile="0.5").value.max == 0.3


def test_combined_reports_leave_the_windows_figures_out_and_say_so(monkeypatch):
    from servescope.stats import Distribution

    rep = report_with_telemetry(monkeypatch)
    rep.distributions["total"] = Distribution()
    combined = Report.combine([rep, rep])
    assert combined.load.server_metrics is None and combined.load.gpu is None
    assert {"load.server_metrics", "load.gpu"} <= set(combined.meta["not_combined"])
