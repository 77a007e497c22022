"""The bundled example: a text-scoring endpoint on a PyTorch model, timed stage by stage.

``servescope demo`` (and ``make demo``) runs it: one cold request, then warm ones, each in a
trace, and prints the report. The handler is written the way guides write one, with
``servescope.stage`` around each step.
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any, Callable

from . import stage, trace
from .exceptions import ConfigError, require
from .recorder import Recorder
from .report import Report

VOCAB = 4096
SENTENCES = [
    "the service answers quickly and the results look right",
    "latency spikes every few minutes and nobody knows why",
    "batching doubled our throughput on the same hardware",
    "the first request after a deploy takes several seconds",
]


def build_model(device: str = "cpu") -> Any:
    """A small scoring model: hashed bag of words -> MLP -> two classes."""
    torch = require("torch", "torch", "the demo endpoint runs a PyTorch model.")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(VOCAB, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 2),
    )
    return model.to(device).eval()


def make_handler(model: Any, device: str = "cpu") -> Callable[[bytes], bytes]:
    """The endpoint: raw JSON body in, JSON body out."""
    import torch

    def handler(body: bytes) -> bytes:
        with stage("validate"):
            payload = json.loads(body)
            text = payload.get("text") if isinstance(payload, dict) else None
            if not isinstance(text, str) or not text:
                raise ValueError("payload must be an object with a non-empty 'text'")
        with stage("preprocess"):
            x = torch.zeros(1, VOCAB)
            for word in text.lower().split():
                x[0, zlib.crc32(word.encode()) % VOCAB] += 1.0
        with stage("to_device"):
            x = x.to(device)
        with stage("infer"), torch.inference_mode():
            logits = model(x)
        with stage("to_host"):
            logits = logits.cpu()
        with stage("postprocess"):
            probs = torch.softmax(logits, dim=-1)[0].tolist()
            result = {"label": "positive" if probs[1] > probs[0] else "negative", "scores": probs}
        with stage("serialize"):
            return json.dumps(result).encode()

    return handler


def run_demo(*, requests: int = 300, clock_mode: str = "auto") -> Report:
    """Time the example endpoint: one cold request, then ``requests`` warm ones."""
    if requests < 1:
        raise ConfigError(f"requests must be >= 1, got {requests}")
    torch = require("torch", "torch", "the demo endpoint runs a PyTorch model.")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    with trace(cuda=clock_mode) as loading:  # type: ignore[arg-type]
        with stage("load"):
            model = build_model(device)
    handler = make_handler(model, device)
    recorder = Recorder()
    for i in range(requests + 1):  # the first one is the cold request
        body = json.dumps({"text": SENTENCES[i % len(SENTENCES)] * (1 + i % 3)}).encode()
        with trace(cuda=clock_mode, recorder=recorder):  # type: ignore[arg-type]
            handler(body)
    return recorder.report(
        title=f"servescope demo: text-scoring endpoint (MLP {VOCAB}-1024-1024-2) on {device}",
        tool="servescope demo",
        requests=requests + 1,
        load_ms=round(loading.total_ms or 0.0, 3),
        seconds=round(time.perf_counter() - started, 3),
    )
