"""The metric names servescope knows, by server: what each is, in words, and its unit.

    known("vllm:time_to_first_token_seconds")   # ("vllm", Known("time to first token", "s"))

``bench --scrape`` (``telemetry.py``) shows these series first, with their description, and
keeps the others in the JSON only. A name is as the server writes it in its /metrics: vLLM's
counters with ``_total``, TGI's and Triton's without.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["KNOWN", "Known", "known", "rank"]


class Known(NamedTuple):
    """What a metric is, in words, and its unit; ``per``: a counter to divide this one's
    increase by (Triton's durations: the average per successful request)."""

    label: str
    unit: str
    per: str | None = None


_TRITON_REQUESTS = "nv_inference_request_success"

#: Metric names each server exposes (as written in its /metrics), in the order the terminal
#: lists them. Units: s, us, bytes, ratio (0 to 1), cpu_s (CPU seconds: the rate is cores
#: busy), or a word for a count.
KNOWN: dict[str, dict[str, Known]] = {
    "vllm": {
        "vllm:num_requests_running": Known("requests running", "requests"),
        "vllm:num_requests_waiting": Known("requests waiting", "requests"),
        "vllm:num_requests_swapped": Known("requests swapped to CPU", "requests"),
        "vllm:kv_cache_usage_perc": Known("KV cache usage", "ratio"),
        "vllm:gpu_cache_usage_perc": Known("KV cache usage (GPU)", "ratio"),
        "vllm:cpu_cache_usage_perc": Known("KV cache usage (CPU)", "ratio"),
        "vllm:prompt_tokens_total": Known("prompt tokens", "tokens"),
        "vllm:generation_tokens_total": Known("generated tokens", "tokens"),
        "vllm:request_success_total": Known("requests finished", "requests"),
        "vllm:num_preemptions_total": Known("preemptions", "requests"),
        "vllm:prefix_cache_queries_total": Known("prefix cache queries", "tokens"),
        "vllm:prefix_cache_hits_total": Known("prefix cache hits", "tokens"),
        "vllm:time_to_first_token_seconds": Known("time to first token", "s"),
        "vllm:inter_token_latency_seconds": Known("inter-token latency", "s"),
        "vllm:time_per_output_token_seconds": Known("time per output token", "s"),
        "vllm:e2e_request_latency_seconds": Known("request latency, end to end", "s"),
        "vllm:request_queue_time_seconds": Known("time waiting in the queue", "s"),
        "vllm:request_prefill_time_seconds": Known("prefill time", "s"),
        "vllm:request_decode_time_seconds": Known("decode time", "s"),
        "vllm:request_inference_time_seconds": Known("time running (prefill + decode)", "s"),
        "vllm:request_prompt_tokens": Known("prompt tokens per request", "tokens"),
        "vllm:request_generation_tokens": Known("generated tokens per request", "tokens"),
        "vllm:iteration_tokens_total": Known("tokens per engine step", "tokens"),
    },
    "tgi": {
        "tgi_queue_size": Known("requests in the queue", "requests"),
        "tgi_batch_current_size": Known("batch size", "requests"),
        "tgi_batch_current_max_tokens": Known("batch token budget", "tokens"),
        "tgi_request_count": Known("requests", "requests"),
        "tgi_request_success": Known("requests succeeded", "requests"),
        "tgi_request_failure": Known("requests failed", "requests"),
        "tgi_request_duration": Known("request duration", "s"),
        "tgi_request_queue_duration": Known("time in the queue", "s"),
        "tgi_request_validation_duration": Known("validation time", "s"),
        "tgi_request_inference_duration": Known("inference time", "s"),
        "tgi_request_mean_time_per_token_duration": Known("time per output token (each request's mean)", "s"),
        "tgi_request_generated_tokens": Known("generated tokens per request", "tokens"),
        "tgi_request_input_length": Known("input tokens per request", "tokens"),
        "tgi_batch_inference_duration": Known("batch inference time", "s"),
        "tgi_batch_forward_duration": Known("batch forward time", "s"),
    },
    "triton": {
        "nv_inference_pending_request_count": Known("requests pending", "requests"),
        _TRITON_REQUESTS: Known("requests succeeded", "requests"),
        "nv_inference_request_failure": Known("requests failed", "requests"),
        "nv_inference_count": Known("inferences (batch items)", "items"),
        "nv_inference_exec_count": Known("model executions (batches)", "batches"),
        "nv_inference_request_duration_us": Known("request time, per request", "us", _TRITON_REQUESTS),
        "nv_inference_queue_duration_us": Known("queue time, per request", "us", _TRITON_REQUESTS),
        "nv_inference_compute_input_duration_us": Known("input time, per request", "us", _TRITON_REQUESTS),
        "nv_inference_compute_infer_duration_us": Known("compute time, per request", "us", _TRITON_REQUESTS),
        "nv_inference_compute_output_duration_us": Known("output time, per request", "us", _TRITON_REQUESTS),
        "nv_gpu_utilization": Known("GPU utilization", "ratio"),
        "nv_gpu_memory_used_bytes": Known("GPU memory used", "bytes"),
        "nv_gpu_memory_total_bytes": Known("GPU memory", "bytes"),
        "nv_gpu_power_usage": Known("GPU power", "W"),
    },
    "servescope": {
        "servescope_request_seconds": Known("server time per request", "s"),
        "servescope_stage_seconds": Known("time in the stage", "s"),
        "servescope_requests_total": Known("requests answered", "requests"),
        "servescope_time_to_first_chunk_seconds": Known("time to first chunk", "s"),
        "servescope_chunk_gap_seconds": Known("gap between chunks", "s"),
        "servescope_batch_size": Known("items per forward", "items"),
        "servescope_queue_depth": Known("items waiting for the worker", "items"),
        "servescope_torch_threads": Known("torch threads", "threads"),
        "servescope_worker_replacements_total": Known("workers replaced", "workers"),
    },
    # any server on a Prometheus client library (vLLM's API server, servescope.serve ...)
    "process": {
        "process_cpu_seconds_total": Known("CPU of the server process", "cpu_s"),
        "process_resident_memory_bytes": Known("resident memory of the server process", "bytes"),
    },
}
_RANK = {name: (kind, i) for i, (kind, name) in enumerate((k, n) for k, names in KNOWN.items() for n in names)}


def known(name: str) -> tuple[str, Known] | None:
    """The server kind and description of a metric name, or None."""
    hit = _RANK.get(name)
    return None if hit is None else (hit[0], KNOWN[hit[0]][name])


def rank(name: str) -> int | None:
    """Where a known metric comes in ``KNOWN``'s order (the order the terminal lists them), or None."""
    hit = _RANK.get(name)
    return None if hit is None else hit[1]
