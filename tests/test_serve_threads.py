"""The thread tuner of servescope.serve (serve/threads.py), on a clock and forward times given
by hand: it keeps the count that is measurably fastest, says when it moves, and looks again
when the machine changes."""

import threading

import pytest

from servescope.serve.threads import MARGIN, MAX_PERIOD_S, PERIOD_S, SAMPLES, ThreadTuner, thread_choices

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def tuner(cost_ms: dict[int, float], start: int = 2):
    clock, applied, switched = Clock(), [], []
    t = ThreadTuner(apply=applied.append, start=start, choices=thread_choices(start), clock=clock,
                    on_switch=lambda a, b, why: switched.append((a, b, why)), first_in_s=PERIOD_S)  # fmt: skip

    def forwards(n: int, items: int = 4) -> list[int]:
        ran = []
        for _ in range(n):
            k = t.next()
            ran.append(k)
            t.record(k, int(cost_ms[k] * MS * items), items)
        return ran

    return t, clock, applied, switched, forwards


def test_choices_are_the_count_half_and_one():
    assert thread_choices(8) == [8, 4, 1] and thread_choices(2) == [2, 1] and thread_choices(1) == [1]


def test_a_count_that_is_measurably_faster_is_taken_and_said():
    cost = {2: 10.0, 1: 3.0}  # a neighbour on one core: two threads wait for each other
    t, clock, applied, switched, forwards = tuner(cost)
    assert set(forwards(20)) == {2}  # settled until the first exploration is due
    clock.t = PERIOD_S
    explored = forwards(2 * SAMPLES)
    assert explored == [2, 1] * SAMPLES  # interleaved: a change in the machine hits both alike
    assert t.current == 1 and switched and switched[0][:2] == (2, 1) and "3.000 ms per item at 1" in switched[0][2]
    assert set(forwards(10)) == {1} and applied == [2] + [1, 2] * (SAMPLES - 1) + [1]  # (set only when it changes)


def test_a_difference_within_the_margin_keeps_the_count_and_looks_again_later():
    cost = {2: 10.0, 1: 10.0 * MARGIN * 1.05}
    t, clock, _, switched, forwards = tuner(cost)
    clock.t = PERIOD_S
    forwards(2 * SAMPLES)
    assert t.current == 2 and not switched and t.period_s == 2 * PERIOD_S
    clock.t += t.period_s - 0.1
    assert set(forwards(5)) == {2}  # not due yet
    for _ in range(6):
        clock.t += t.period_s
        forwards(2 * SAMPLES)
    assert t.period_s == MAX_PERIOD_S and t.explorations == 7


def test_settled_forwards_that_slow_down_start_an_exploration_at_once():
    cost = {2: 4.0, 1: 7.0}  # quiet: both threads help
    t, clock, _, switched, forwards = tuner(cost)
    clock.t = PERIOD_S
    forwards(2 * SAMPLES)
    assert t.current == 2 and t.explorations == 1
    cost[2] = 30.0  # a neighbour arrives
    ran = forwards(8 + 2 * SAMPLES)
    assert 1 in ran and t.current == 1 and t.explorations == 2  # long before the next period was due
    cost[2] = 4.0  # ... and leaves: found at the next due exploration
    clock.t += t.period_s
    forwards(2 * SAMPLES)
    assert t.current == 2 and [s[:2] for s in switched] == [(2, 1), (1, 2)]


def test_each_thread_that_runs_forwards_gets_the_count_once():
    t, clock, applied, _, forwards = tuner({2: 1.0, 1: 1.0})
    forwards(3)
    other = threading.Thread(target=lambda: forwards(3))
    other.start()
    other.join()
    assert applied == [2, 2]  # once on this thread, once on the other: never again while unchanged


def test_one_thread_has_nothing_to_explore():
    t, clock, applied, _, forwards = tuner({1: 1.0}, start=1)
    clock.t = 10 * PERIOD_S
    assert set(forwards(10)) == {1} and t.explorations == 0


def test_the_runtime_moves_to_the_count_its_forwards_run_fastest_at(torch_on_two_cpus):
    """A real Runtime and real torch.set_num_threads: a model whose forward is 10x slower at
    two threads than at one (as with a neighbour on a core) ends up served at one, on the
    thread that runs the forwards; a user who fixed the count keeps it."""
    import time

    torch = torch_on_two_cpus
    import servescope
    from servescope.serve import runtime as rt
    from servescope.serve.batching import Item

    class Slow(servescope.Model):
        def load(self, device):
            return torch.nn.Identity()

        def preprocess(self, request):
            return torch.tensor([float(request)])

        def infer(self, batch):
            time.sleep(0.002 if torch.get_num_threads() == 1 else 0.02)
            return batch

    runtime = rt.Runtime(Slow())
    runtime.load()
    runtime.warm_up(1, [1])
    assert runtime.adapt_threads()
    runtime.tuner._next_at = 0.0  # (due now: the period is tested above, on a clock given by hand)
    for k in range(3 * SAMPLES):
        items = [Item(k)]
        runtime.process(items)
        assert items[0].error is None
    assert runtime.tuner.current == 1 and torch.get_num_threads() == 1
    fixed = rt.Runtime(Slow(), threads=2)
    fixed.load()
    assert not fixed.adapt_threads()  # --threads (or OMP_NUM_THREADS): the user's count stays


def test_a_count_plainly_worse_is_tried_twice_not_five_times():
    cost = {1: 2.0, 2: 6.0}  # settled at 1; two threads 3x slower
    t, clock, _, switched, forwards = tuner(cost, start=1)
    t.choices = [1, 2]
    clock.t = PERIOD_S
    ran = forwards(2 * SAMPLES)
    assert ran[:4] == [1, 2, 1, 2] and ran[4:] == [1] * (2 * SAMPLES - 4)  # after two slow ones, two threads are dropped
    assert t.current == 1 and not switched and t.explorations == 1


def test_a_count_far_worse_is_tried_once():
    cost = {1: 2.0, 2: 30.0}  # settled at 1 after a neighbour came; two threads still 15x slower
    t, clock, _, switched, forwards = tuner(cost, start=1)
    t.choices = [1, 2]
    clock.t = PERIOD_S
    ran = forwards(2 * SAMPLES)
    assert ran[:3] == [1, 2, 1] and ran[3:] == [1] * (2 * SAMPLES - 3)  # one forward 15x slower is enough
    assert t.current == 1 and not switched and t.explorations == 1


def test_by_default_the_first_forwards_explore_a_neighbour_there_from_the_start():
    clock, applied = Clock(), []
    t = ThreadTuner(apply=applied.append, start=2, choices=[2, 1], clock=clock)
    ran = []
    for _ in range(2 * SAMPLES):
        k = t.next()
        ran.append(k)
        t.record(k, (30 if k == 2 else 3) * MS, 1)
    assert ran[:2] == [2, 1] and t.current == 1 and clock.t == 0.0


def test_a_streams_steps_are_measured_too(torch_on_two_cpus):
    """A model that yields: each decode step is a forward, so a small decoder whose steps are
    10x slower at two threads (OpenMP waking its threads each step) is served at one."""
    import time

    torch = torch_on_two_cpus
    import servescope
    from servescope.serve import runtime as rt
    from servescope.serve.batching import Item

    class Decoder(servescope.Model):
        def load(self, device):
            return torch.nn.Identity()

        def preprocess(self, request):
            return torch.tensor([float(request)])

        def infer(self, batch):
            for _ in range(4 * SAMPLES):
                time.sleep(0.002 if torch.get_num_threads() == 1 else 0.02)
                yield batch

        def postprocess(self, step):
            return {"x": float(step[0])}

    runtime = rt.Runtime(Decoder())
    runtime.load()
    assert runtime.adapt_threads()
    runtime.tuner._next_at = 0.0  # (due now)
    items = [Item(1)]
    runtime.process(items)  # one stream, run to its end (no server: warm-up's way)
    assert items[0].error is None and runtime.tuner.current == 1


def test_inputs_of_a_length_are_timed_per_token_so_cycled_lengths_do_not_decide():
    """Requests cycled in order (a long text, a short one, ...) meet the exploration's A B A B:
    per item, one count would get every long one. Per token (items x the longest) the two
    counts, equally fast, compare equal, and the count stays."""
    t, clock, _, switched, _ = tuner({2: 1.0, 1: 1.0})
    clock.t = PERIOD_S
    for i in range(2 * SAMPLES):
        k = t.next()
        tokens = 200 if i % 2 == 0 else 20  # the long texts fall on one count
        t.record(k, int(0.1 * MS * tokens), 1, tokens)
    assert t.current == 2 and not switched and t.explorations == 1
