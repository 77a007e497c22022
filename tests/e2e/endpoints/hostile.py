"""Endpoints that misbehave, for the doctor's honesty tests (tests/e2e/test_doctor_truth.py)."""

import os
import sys
import threading
import time

import torch


def hangs(payload):
    time.sleep(3600)


def forks(payload):
    if os.fork() == 0:  # a child left running: the doctor must end it with the run
        time.sleep(600)
        os._exit(0)
    return {"ok": True}


def exits(payload):
    sys.exit(3)


def exits_hard(payload):
    os._exit(3)


def leaves_a_thread(payload):
    threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon: never ends
    return {"ok": True}


def interrupts(payload):
    raise KeyboardInterrupt


MODEL = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()).eval()


def slow_torch(payload):
    """~2 s a request on torch's own threads: a process that exits with them alive aborted."""
    deadline = time.perf_counter() + 1.5
    x = torch.ones(64, 256)
    with torch.inference_mode():
        while time.perf_counter() < deadline:
            x = MODEL(x)
    return {"ok": float(x[0, 0])}
