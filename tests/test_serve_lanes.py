"""Forwards in parallel lanes (serve/lanes.py, Runtime._in_lanes): a batch's forwards run two at
once, each item gets its own answer, a helper left in a stuck forward does not hold the next
batches, and a model that yields or a user who fixed the threads keeps one forward at a time."""

import threading

import pytest

import servescope
from servescope.exceptions import ConfigError
from servescope.serve import runtime as rt
from servescope.serve.batching import Item
from servescope.serve.lanes import Lanes


class Echo(servescope.Model):
    """Variable-length lists of numbers; a forward records its thread and sizes. The worker's
    forwards wait (inside the forward) until a helper is inside one (``helper_in``): so the
    two are in a forward at once, or the test fails on the timeout. A helper's forward may
    wait on ``gate`` (set by the test) before it returns: a stuck forward."""

    def __init__(self) -> None:
        self.forwards: list[tuple[str, int]] = []
        self.gate: threading.Event | None = None
        self.helper_in = threading.Event()
        self.wait_for_helper = False
        self.lock = threading.Lock()

    def load(self, device):
        return "echo"

    def preprocess(self, request):
        return [float(request)] * (1 + int(request) % 7)  # lengths 1-7: grouped by length

    def collate(self, inputs):
        return inputs

    def infer(self, batch):
        with self.lock:
            self.forwards.append((threading.current_thread().name, len(batch)))
        if threading.current_thread().name.startswith("servescope-lane"):
            self.helper_in.set()
            if self.gate is not None:
                self.gate.wait(10)
        elif self.wait_for_helper and not self.helper_in.wait(10):
            raise AssertionError("no forward ran beside this one")
        return [sum(x) for x in batch]

    def split(self, out, n):
        return out

    def postprocess(self, y, request):
        return {"y": y, "x": request}


def runtime(lanes: int | None, model: Echo | None = None) -> rt.Runtime:
    r = rt.Runtime(model or Echo(), lanes=lanes)
    r.delivered = []  # what the server would answer, from every batch
    r.on_batch_done = r.delivered.extend
    r.load()
    r.start_lanes()
    return r


def answers(r: rt.Runtime, xs: list[int]) -> list[dict]:
    items = [Item(x) for x in xs]
    r.process(items)
    assert all(it.error is None for it in items), [it.error for it in items if it.error]
    assert all(sum(d is it for d in r.delivered) == 1 for it in items)  # each answered once
    import orjson

    return [orjson.loads(it.body) for it in items]


def test_the_heaviest_forward_goes_first():
    assert list(Lanes.order([3.0, 10.0, 1.0, 7.0])) == [1, 3, 0, 2]


def test_two_forwards_run_at_once_and_every_item_gets_its_own_answer():
    model = Echo()
    model.wait_for_helper = True
    r = runtime(2, model)
    xs = list(range(16))
    got = answers(r, xs)
    assert [g["x"] for g in got] == xs and [g["y"] for g in got] == [float(x) * (1 + x % 7) for x in xs]
    threads = {name for name, _ in model.forwards}
    assert any(n.startswith("servescope-lane") for n in threads) and len(threads) == 2
    # cut into at least three forwards per lane, none over ceil(16 / 6) items
    assert len(model.forwards) >= 6 and max(n for _, n in model.forwards) <= 3
    assert answers(runtime(1), xs) == got  # the same answers one forward at a time


def test_one_lane_runs_every_forward_on_the_worker_thread():
    model = Echo()
    answers(runtime(1, model), list(range(16)))
    assert {name for name, _ in model.forwards} == {threading.current_thread().name}


def test_a_helper_stuck_in_a_forward_does_not_hold_the_next_batches():
    model = Echo()
    model.gate = threading.Event()  # the helper's forwards wait on it: stuck
    model.wait_for_helper = True
    r = runtime(2, model)
    first = threading.Thread(target=answers, args=(r, list(range(16))), daemon=True)
    first.start()  # its worker waits for the stuck helper, as the watchdog would see
    assert model.helper_in.wait(10)
    second = answers(r, list(range(8)))  # another worker (a replaced one) is not held by it
    assert [g["x"] for g in second] == list(range(8))
    model.gate.set()
    first.join(10)
    assert not first.is_alive()


def test_a_bug_in_a_lane_fails_its_batch_and_keeps_the_worker(monkeypatch):
    r = runtime(2)
    real, hit = r._forward_from, threading.Event()

    def broken(ready, members, inputs, *rest):
        if threading.current_thread().name.startswith("servescope-lane"):
            hit.set()
            raise RuntimeError("a bug of ours")
        hit.wait(10)  # (the worker's first forward waits until the helper has taken one)
        return real(ready, members, inputs, *rest)

    monkeypatch.setattr(r, "_forward_from", broken)
    items = [Item(x) for x in range(16)]
    r.on_batch_done = lambda done: None
    r.process(items)
    assert all(it.body is not None or it.error for it in items)  # answered or failed: none left hanging
    assert any(it.error for it in items)


def test_lanes_by_default_only_where_they_are_safe_and_measured():
    class Streams(Echo):
        def infer(self, batch):
            yield [sum(x) for x in batch]

    assert runtime(2, Streams()).start_lanes()[0] == 1  # a model that yields: one step at a time
    plain = runtime(None)
    assert plain.start_lanes()[1].startswith("not a torch model") and not plain.info["uses_torch"]
    with pytest.raises(ConfigError, match="lanes must be"):
        servescope.serve(Echo(), lanes=0)


def test_a_torch_model_whose_threads_are_adapted_gets_two_lanes(torch_on_two_cpus):
    torch = torch_on_two_cpus

    class Tiny(servescope.Model):
        def load(self, device):
            return torch.nn.Identity()

        def preprocess(self, request):
            return torch.tensor([float(request)])

    r = rt.Runtime(Tiny())
    assert r.load()["uses_torch"]
    assert r.adapt_threads() and r.start_lanes() == (2, "torch on the CPU, its threads adapted here")
    fixed = rt.Runtime(Tiny(), threads=2)
    fixed.load()
    assert not fixed.adapt_threads() and fixed.start_lanes()[0] == 1  # the user's count: as they set it
