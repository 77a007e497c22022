"""The doctor's savings on endpoints whose costs are known: it tries the fix and measures what
the fix saves, in real time (sleeps, which a busy machine does not stretch by much)."""

from __future__ import annotations

import io
import pickle
import time

import pytest

from servescope.doctor import DoctorOptions, diagnose

pytestmark = pytest.mark.e2e
OPTIONS = DoctorOptions(requests=8, concurrency=4, concurrent_requests=16, timeout_s=10.0, experiment_seconds=20.0)


class Weights:
    """A model file whose loading takes 50 ms (unpickling sleeps)."""

    def __init__(self) -> None:
        self.w = [0.5, 0.25]

    def __setstate__(self, state):
        time.sleep(0.05)
        self.__dict__.update(state)


BLOB = pickle.dumps(Weights())


def loads_per_request(payload):
    model = pickle.load(io.BytesIO(BLOB))  # on every request
    time.sleep(0.005)  # the rest of the request
    return {"y": sum(w * x for w, x in zip(model.w, payload["x"]))}


def test_a_loader_that_takes_50_ms_is_measured_at_50_ms():
    rep = diagnose(loads_per_request, payload={"x": [1.0, 2.0]}, options=OPTIONS)
    [f] = [f for f in rep.findings if f.id == "model-load-per-request"]
    assert f.saving_basis == "measured" and f.saving_load == "c=1", f.detail
    assert f.saving_ms == pytest.approx(50.0, abs=5.0), f.detail
    assert f.saving_low_ms <= f.saving_ms <= f.saving_high_ms and 30.0 <= f.saving_low_ms and f.saving_high_ms <= 70.0
    assert f.severity == "critical"
    what_if = rep.diagnosis.evidence["experiments"]["memoise-loaders"]
    assert what_if["answers"] == "same" and what_if["hits"] >= 3


def test_a_forward_that_costs_twice_with_autograd_is_measured_at_its_own_batch():
    torch = pytest.importorskip("torch")

    class Scorer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x):
            time.sleep(0.02 * (2 if torch.is_grad_enabled() else 1))  # autograd doubles its cost
            return self.lin(x)

    model = Scorer().eval()

    def score(payload):
        x = torch.tensor(payload["rows"], dtype=torch.float32)
        return {"s": model(x)[:, 0].detach().tolist()}

    rep = diagnose(score, payload={"rows": [[0.1, 0.2, 0.3, 0.4]] * 20}, options=OPTIONS)
    [f] = [f for f in rep.findings if f.id == "grad-enabled"]
    assert f.saving_basis == "measured" and f.saving_ms == pytest.approx(20.0, abs=4.0), f.detail
    assert f.evidence["batch_sizes"] == [20] and f.severity in ("high", "critical")  # (20 of ~40 ms: the 50% line)


def test_a_fix_that_would_change_the_answers_is_not_tried_and_the_estimate_says_why():
    def mutates(payload):
        model = pickle.load(io.BytesIO(BLOB))
        model.w.append(payload["x"][0])  # it changes the loaded object: loaded once, it would grow
        return {"n": len(model.w)}

    rep = diagnose(mutates, payload={"x": [1.0]}, options=OPTIONS)
    [f] = [f for f in rep.findings if f.id == "model-load-per-request"]
    what_if = rep.diagnosis.evidence["experiments"]["memoise-loaders"]
    assert not what_if["tried"] and "answers changed" in what_if["why_not"]
    assert f.saving_basis == "estimated" and "not tried on the endpoint: the answers changed" in f.detail
    assert f.saving_ms == pytest.approx(50.0, abs=10.0)  # the loader's own time, which the probes timed


class AfterABurst:
    """A process that runs its requests 4x faster once concurrent requests have overlapped (as
    torch beside a busy neighbour can for a while): sequential requests take 40 ms of work."""

    def __init__(self) -> None:
        self.inside, self.overlapped, self.lock = 0, False, __import__("threading").Lock()

    def __call__(self, payload):
        with self.lock:
            self.inside += 1
            self.overlapped = self.overlapped or self.inside > 1
            fast = self.overlapped
        try:
            model = pickle.load(io.BytesIO(BLOB))  # 50 ms, on every request
            time.sleep(0.01 if fast else 0.04)
            return {"y": sum(w * x for w, x in zip(model.w, payload["x"]))}
        finally:
            with self.lock:
                self.inside -= 1


def test_a_saving_at_one_client_is_measured_in_the_state_the_sequential_requests_saw():
    # the loader's 50 ms in blocks whose base is the warm requests' 90 ms, not the 60 ms a
    # process answers at after the concurrent burst
    endpoint = AfterABurst()
    rep = diagnose(endpoint, payload={"x": [1.0, 2.0]}, options=OPTIONS)
    what_if = rep.diagnosis.evidence["experiments"]["memoise-loaders"]
    assert endpoint.overlapped  # (the burst did come, after the experiment)
    assert what_if["base_p50_ms"] == pytest.approx(90.0, abs=10.0), what_if
    assert what_if["saving_ms"] == pytest.approx(50.0, abs=5.0), what_if
