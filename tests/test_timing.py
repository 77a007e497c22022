from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import sys
import threading

import pytest

import servescope
from servescope import CudaEventClock, StageError, SyncClock, WallClock, stage, trace
from servescope.exceptions import ConfigError, RecordError


def test_stages_time_their_blocks_and_the_rest_is_other(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        with speedups.stage("validate"):
            clock.advance(0.04)
        with speedups.stage("preprocess"):
            clock.advance(1.9)
        clock.advance(0.5)  # outside any stage
        with speedups.stage("infer"):
            clock.advance(3.2)
    assert t.durations_ms == pytest.approx({"validate": 0.04, "preprocess": 1.9, "infer": 3.2, "other": 0.5})
    assert t.total_ms == pytest.approx(5.64)
    assert list(t.durations_ms) == ["validate", "preprocess", "infer", "other"]


def test_durations_follow_the_request_path_not_the_call_order(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        for name in ("serialize", "custom", "infer", "load"):
            with speedups.stage(name):
                clock.advance(1)
    assert list(t.durations_ms) == ["load", "infer", "serialize", "custom"]


def test_nested_stage_time_is_not_counted_twice(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        with speedups.stage("preprocess"):
            clock.advance(1)
            with speedups.stage("to_device"):
                clock.advance(2)
            clock.advance(1)
    assert t.durations_ms == pytest.approx({"preprocess": 2.0, "to_device": 2.0})
    assert sum(t.durations_ms.values()) == pytest.approx(t.total_ms)


def test_repeated_stage_names_add_up(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        for _ in range(3):
            with speedups.stage("infer"):
                clock.advance(1.5)
    assert t.durations_ms == {"infer": pytest.approx(4.5)}


def test_decorator_on_sync_and_async_functions(speedups, clock):
    @speedups.stage("preprocess")
    def prep(x):
        clock.advance(2)
        return x + 1

    @speedups.stage("infer")
    async def infer(x):
        clock.advance(3)
        await asyncio.sleep(0)
        return x * 2

    assert prep.__name__ == "prep"

    async def handler():
        with speedups.trace(clock=WallClock(clock.now)) as t:
            y = await infer(prep(1))
        return t, y

    t, y = asyncio.run(handler())
    assert y == 4
    assert t.durations_ms == pytest.approx({"preprocess": 2.0, "infer": 3.0})


def test_a_decorated_generator_times_each_item_it_makes_not_the_consumer(speedups, clock):
    @speedups.stage("postprocess")
    def tokens(n):
        for i in range(n):
            clock.advance(2)  # making an item
            yield i
        clock.advance(1)  # the end
        return "done"

    assert inspect.isgeneratorfunction(tokens)  # FastAPI's `yield` dependencies check this

    with speedups.trace(clock=WallClock(clock.now)) as t:
        out = []
        for item in tokens(3):
            out.append(item)
            clock.advance(10)  # the consumer (writing the chunk): not the generator's time
    assert out == [0, 1, 2]
    assert t.durations_ms == pytest.approx({"postprocess": 7.0, "other": 30.0})

    def consume():
        return (yield from tokens(1))

    with speedups.trace(clock=WallClock(clock.now)):
        gen = consume()
        next(gen)
        with pytest.raises(StopIteration) as stop:
            next(gen)
    assert stop.value.value == "done"  # the return value comes through


def test_a_decorated_generator_passes_send_throw_and_close_through(speedups, clock):
    log = []

    @speedups.stage("postprocess")
    def echo():
        try:
            received = yield "ready"
            while True:
                try:
                    received = yield received * 2
                except ValueError as exc:
                    received = yield f"caught {exc}"
        finally:
            clock.advance(4)  # clean-up is the generator's work too
            log.append("closed")

    class Model:
        @speedups.stage("infer")
        def stream(self, n):
            yield from range(n)

    with speedups.trace(clock=WallClock(clock.now)) as t:
        gen = echo()
        assert next(gen) == "ready"
        assert gen.send(21) == 42
        assert gen.throw(ValueError("bad chunk")) == "caught bad chunk"
        assert gen.send(1) == 2
        gen.close()
        assert list(Model().stream(2)) == [0, 1]  # methods bind as before
    assert log == ["closed"]
    assert t.durations_ms["postprocess"] == pytest.approx(4.0)

    @speedups.stage("postprocess")
    def broken():
        yield 1
        raise RuntimeError("stream broke")

    with pytest.raises(RuntimeError, match="stream broke"), speedups.trace(clock=WallClock(clock.now)) as t:
        list(broken())
    assert t.error == "RuntimeError: stream broke"


def test_a_decorated_async_generator_times_each_item(speedups, clock):
    closed = []

    @speedups.stage("postprocess")
    async def tokens(n):
        try:
            for i in range(n):
                clock.advance(2)
                await asyncio.sleep(0)
                yield i
        finally:
            closed.append(True)

    assert inspect.isasyncgenfunction(tokens)

    async def handler():
        with speedups.trace(clock=WallClock(clock.now)) as t:
            out = []
            async for item in tokens(3):
                out.append(item)
                clock.advance(10)
            agen = tokens(5)
            assert await agen.__anext__() == 0
            await agen.aclose()  # stopped early: the generator's finally runs
        return t, out

    t, out = asyncio.run(handler())
    assert out == [0, 1, 2] and closed == [True, True]
    assert t.durations_ms == pytest.approx({"postprocess": 8.0, "other": 30.0})

    @speedups.stage("postprocess")
    async def answer():
        try:
            yield "ready"
        except ValueError:
            yield "recovered"

    async def thrown():
        agen = answer()
        await agen.__anext__()
        return await agen.athrow(ValueError("x"))

    assert asyncio.run(thrown()) == "recovered"


def test_async_with_form(speedups, clock):
    async def handler():
        async with speedups.trace(clock=WallClock(clock.now)) as t:
            async with speedups.stage("infer"):
                clock.advance(1)
        return t

    assert asyncio.run(handler()).durations_ms == {"infer": pytest.approx(1.0)}


def test_outside_a_trace_stages_record_nothing_and_never_fail(speedups):
    assert servescope.current_trace() is None
    with speedups.stage("infer") as s:
        pass
    assert s.name == "infer"

    @speedups.stage("postprocess")
    def f():
        return 42

    assert f() == 42


def test_stage_in_a_thread_started_with_the_context_lands_in_the_request(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        ctx = contextvars.copy_context()

        def work():
            with speedups.stage("preprocess"):
                clock.advance(2)

        th = threading.Thread(target=ctx.run, args=(work,))
        th.start()
        th.join()
    assert t.durations_ms["preprocess"] == pytest.approx(2.0)


def test_thread_without_the_context_does_not_leak_into_the_request(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        th = threading.Thread(target=lambda: speedups.stage("stray").__enter__())
        th.start()
        th.join()
    assert "stray" not in t.durations_ms


def test_to_thread_and_tasks_carry_the_trace(speedups, clock):
    async def handler():
        with speedups.trace(clock=WallClock(clock.now)) as t:

            def blocking():
                with speedups.stage("infer"):
                    clock.advance(4)

            await asyncio.to_thread(blocking)

            async def post():
                with speedups.stage("postprocess"):
                    clock.advance(1)

            await asyncio.create_task(post())
        return t

    t = asyncio.run(handler())
    assert t.durations_ms == pytest.approx({"infer": 4.0, "postprocess": 1.0})


def test_concurrent_requests_keep_their_own_stages(speedups):
    async def request(name: str, delay: float):
        with speedups.trace() as t:
            with speedups.stage(name):
                await asyncio.sleep(delay)
        return t

    async def main():
        return await asyncio.gather(request("a", 0.01), request("b", 0.0), request("c", 0.005))

    ta, tb, tc = asyncio.run(main())
    assert set(ta.durations_ms) - {"other"} == {"a"}
    assert set(tb.durations_ms) - {"other"} == {"b"}
    assert set(tc.durations_ms) - {"other"} == {"c"}
    assert servescope.current_trace() is None


def test_the_trace_records_the_error_and_reraises(speedups, clock):
    with pytest.raises(KeyError):
        with speedups.trace(clock=WallClock(clock.now)) as t:
            with speedups.stage("validate"):
                clock.advance(1)
                raise KeyError("text")
    assert t.error == "KeyError: 'text'"
    assert t.durations_ms == {"validate": pytest.approx(1.0)}
    assert servescope.current_trace() is None


def test_a_trace_hands_itself_to_its_recorder(speedups, clock):
    rec = servescope.Recorder()
    with speedups.trace(clock=WallClock(clock.now), recorder=rec):
        with speedups.stage("infer"):
            clock.advance(2)
    assert len(rec.latency) == 1
    assert rec.stages["infer"].values().tolist() == [2.0]


@pytest.mark.parametrize("bad", [None, 3, "", b"infer", ["infer"]])
def test_a_stage_name_must_be_a_non_empty_string(speedups, bad):
    with pytest.raises(StageError, match="stage name must be a non-empty string"):
        speedups.stage(bad)


def test_add_takes_time_measured_elsewhere_and_rejects_bad_durations(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        t.add("queue", 2.5)
        with pytest.raises(RecordError, match="'queue'.*-1"):
            t.add("queue", -1)
        with pytest.raises(RecordError):
            t.add("queue", float("nan"))
        clock.advance(1)
    assert t.durations_ms["queue"] == pytest.approx(2.5)  # the good value survived


def test_a_trace_cannot_start_twice_or_finish_unstarted(speedups):
    t = speedups.trace()
    with pytest.raises(ConfigError, match="never started"):
        t.finish()
    with t:
        pass
    with pytest.raises(ConfigError, match="already started"):
        t.start()


def test_trace_takes_keyword_arguments_and_says_so(speedups):
    params = inspect.signature(speedups.trace).parameters
    assert list(params) == ["cuda", "clock", "recorder"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    with pytest.raises(TypeError):
        speedups.trace("events")  # positional: refused, not taken as something else
    with pytest.raises(TypeError, match="bogus"):
        speedups.trace(bogus=1)


def test_unknown_cuda_mode_is_a_clear_error(speedups):
    with pytest.raises(ConfigError, match="cuda must be"):
        speedups.trace(cuda="fast")  # type: ignore[arg-type]


def test_auto_mode_uses_host_clock_when_cuda_is_not_initialized(speedups):
    with speedups.trace() as t:
        pass
    assert t.clock.name == "wall"


def test_auto_mode_follows_torchs_cuda_state(speedups, monkeypatch, gpu):
    import types

    fake_torch = types.ModuleType("torch")
    fake_cuda = types.ModuleType("torch.cuda")
    fake_torch.cuda = fake_cuda
    fake_cuda.Event = gpu.event
    state = {"initialized": False, "bad_fork": False}
    fake_cuda.is_initialized = lambda: state["initialized"] and not state["bad_fork"]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", fake_cuda)

    fake_cuda._initialized = False  # torch imported, CUDA not used (a CPU server)
    assert speedups.trace().clock.name == "wall"
    fake_cuda._initialized = state["initialized"] = True  # a model moved to the GPU
    assert speedups.trace().clock.name == "events"
    assert speedups.trace(cuda="wall").clock.name == "wall"
    state["bad_fork"] = True  # a forked worker of a parent that used CUDA: CUDA unusable here
    assert speedups.trace().clock.name == "wall"


def test_speedups_says_truly_which_twin_runs():
    from servescope import _speedups_py, recorder, timing

    in_python = issubclass(timing.Stage, _speedups_py.StageBase)
    assert timing.SPEEDUPS is not in_python
    assert issubclass(timing.Trace, _speedups_py.TraceBase) is in_python
    assert (timing.stage is _speedups_py.stage) is in_python
    assert (recorder.fold_rows is _speedups_py.fold_rows) is in_python
    if sys.platform.startswith("linux") and not os.environ.get("SERVESCOPE_NO_SPEEDUPS"):  # `make test` builds it
        from servescope import _speedups

        assert timing.SPEEDUPS and issubclass(timing.Stage, _speedups.StageBase)
        assert issubclass(timing.Trace, _speedups.TraceBase) and recorder.fold_rows is _speedups.fold_rows


def test_servescope_no_speedups_turns_the_c_extension_off(monkeypatch):
    """The switch is read once, at import: here the choice itself, without a second import."""
    import importlib.util

    from servescope import _speedups_py, timing

    monkeypatch.delenv("SERVESCOPE_NO_SPEEDUPS", raising=False)
    built = importlib.util.find_spec("servescope._speedups") is not None
    assert timing._load_speedups().__name__ == ("servescope._speedups" if built else "servescope._speedups_py")
    monkeypatch.setenv("SERVESCOPE_NO_SPEEDUPS", "1")
    assert timing._load_speedups() is _speedups_py
    monkeypatch.delenv("SERVESCOPE_NO_SPEEDUPS")
    monkeypatch.delattr(servescope, "_speedups", raising=False)  # as if it was never built
    monkeypatch.setitem(sys.modules, "servescope._speedups", None)
    assert timing._load_speedups() is _speedups_py


def test_equal_names_held_by_different_stage_objects_add_up(speedups, clock):
    a, b = speedups.Stage("".join(["de", "code"])), speedups.Stage("decode")  # equal names, two string objects
    with speedups.trace(clock=WallClock(clock.now)) as t:
        with a:
            clock.advance(1.0)
            with b:  # nested: the outer one's self time excludes it
                clock.advance(2.0)
        with b:
            clock.advance(0.5)
    assert t.durations_ms == pytest.approx({"decode": 3.5})


def test_stages_survive_pickling_as_the_shared_stage(clock):
    import pickle

    assert b"_speedups" not in pickle.dumps(stage("decode"))  # readable where the extension is not built
    s = pickle.loads(pickle.dumps(stage("decode")))
    assert s is stage("decode") and s.name == "decode"
    with trace(clock=WallClock(clock.now)) as t:
        with s:
            clock.advance(1.0)
    assert t.durations_ms == pytest.approx({"decode": 1.0})


def test_stage_objects_made_per_request_are_not_cached_without_bound(speedups, clock):
    from servescope import timing

    try:
        for i in range(timing._MAX_SHARED + 100):
            speedups.stage(f"dynamic_{i}")
        assert len(speedups.shared) <= timing._MAX_SHARED
        assert speedups.stage("dynamic_0") is speedups.stage("dynamic_0")  # the first ones are shared
        name = f"dynamic_{timing._MAX_SHARED + 50}"
        assert name not in speedups.shared and speedups.stage(name) is not speedups.stage(name)
        with speedups.trace(clock=WallClock(clock.now)) as t:
            with speedups.stage(name):  # uncached: still timed
                clock.advance(2)
        assert t.durations_ms == {name: 2.0}
    finally:
        for key in [k for k in speedups.shared if k.startswith("dynamic_")]:
            del speedups.shared[key]


def test_self_times_nets_each_stage_of_its_children_and_writes_nothing_but_release(speedups):
    tr = object()  # the span's trace
    root = [None, 0, None, None, tr, None, 0]
    pre = ["preprocess", 0, 10, root, tr, None, 0]
    dev = ["to_device", 2, 5, pre, tr, None, 0]  # inside preprocess
    infer = ["infer", 11, 18, root, tr, None, 0]
    dec = ["decode", 12, 14, infer, tr, None, 0]
    post = ["postprocess", 19, None, root, tr, None, 0]  # still open: not counted
    dec2 = ["".join(["de", "code"]), 20, 21, root, tr, None, 0]  # an equal name, another object
    send = ["send", 30, 29, root, tr, None, 0]  # a clock that went backwards: 0, never negative
    ser = ["serialize", 40, 44, root, tr, None, 0]
    tok1 = ["tokenize", 40, 43, ser, tr, None, 0]  # two children on two threads: 6 of its 4 ns
    tok2 = ["tokenize", 41, 44, ser, tr, None, 0]
    spans = [pre, dev, infer, dec, post, dec2, send, ser, tok1, tok2]
    want = ({"preprocess": 7, "to_device": 3, "infer": 5, "decode": 3, "send": 0, "serialize": 0, "tokenize": 6}, 22, 9)
    before = [list(sp) for sp in spans]
    assert speedups.module.self_times(spans, root, False) == want
    assert speedups.module.self_times(spans, root, False) == want  # a header may ask twice
    assert spans == before and root[6] == 0  # no sums written into the spans
    assert speedups.module.self_times(spans, root) == want  # release, by default
    assert [sp[4] for sp in spans] == [None] * 4 + [tr] + [None] * 5  # only the closed ones let go


def test_a_header_mid_request_sees_the_closed_stages_and_changes_nothing(speedups, clock):
    with speedups.trace(clock=WallClock(clock.now)) as t:
        with speedups.stage("preprocess"):
            clock.advance(1)
            with speedups.stage("to_device"):
                clock.advance(2)
            assert t.elapsed_ns() == ({"to_device": 2_000_000}, 3_000_000)
        clock.advance(0.5)
        t.add("queue", 4)
        assert t.elapsed_ns() == ({"preprocess": 1_000_000, "to_device": 2_000_000, "queue": 4_000_000}, 3_500_000)
        assert t.elapsed_ns()[0]["preprocess"] == 1_000_000  # asked again: the same
    assert t.durations_ns == {"preprocess": 1_000_000, "to_device": 2_000_000, "queue": 4_000_000}
    assert t.total_ns == 3_500_000 and t.elapsed_ns() == (t.durations_ns, 3_500_000)
    t.add("send", 0.25)  # after the end: straight into the result
    assert t.durations_ms["send"] == 0.25


def test_device_clocks_resolve_at_the_end_even_after_a_header(speedups, gpu):
    with speedups.trace(clock=SyncClock(synchronize=gpu.synchronize, now=gpu.now)) as t:
        with speedups.stage("preprocess"):
            gpu.cpu(1)
            with speedups.stage("to_device"):
                gpu.cpu(2)
        assert t.elapsed_ns() == ({"preprocess": 1_000_000, "to_device": 2_000_000}, None)  # no sync for "now"
        with speedups.stage("infer"):
            gpu.launch(5)  # the boundary's sync charges the kernel here
    assert t.durations_ns == {"preprocess": 1_000_000, "to_device": 2_000_000, "infer": 5_000_000}
    assert t.total_ns == 8_000_000
    assert [(name, depth) for name, _, _, depth in t.spans()] == [("preprocess", 0), ("to_device", 1), ("infer", 0)]

    with speedups.trace(clock=CudaEventClock(event=gpu.event, now=gpu.now)) as t:
        with speedups.stage("infer"):
            gpu.launch(5)
        with speedups.stage("to_host"):
            gpu.synchronize()
            gpu.cpu(0.1)
    assert t.clock.name == "events"
    assert t.durations_ms["infer"] == pytest.approx(5.0, abs=0.011)
    assert t.durations_ms["to_host"] == pytest.approx(0.1)


def test_stop_keeps_the_trace_attached_until_detach_and_counts_what_was_left_open(speedups, clock):
    t = speedups.trace(clock=WallClock(clock.now)).start()
    assert servescope.current_trace() is t and servescope.timing.current_stage_name() == ""
    speedups.stage("infer").__enter__()  # never closed
    clock.advance(1)
    assert t.stop(error=KeyError("gone")) is t
    assert t.stop() is t  # stopped once: a second stop changes nothing
    assert t.error == "KeyError: 'gone'" and t.open_stages == 1
    assert t.durations_ns == {"other": 1_000_000}
    assert servescope.current_trace() is t
    t.detach()
    assert servescope.current_trace() is None
    t.detach()  # twice: nothing to do

    t = speedups.trace(clock=WallClock(clock.now)).start()
    t.finish(RuntimeError("late"))
    assert t.error == "RuntimeError: late" and servescope.current_trace() is None


def test_a_finished_trace_is_freed_without_the_garbage_collector(speedups, clock):
    import gc
    import weakref

    wall = WallClock(clock.now)
    gone = weakref.ref(wall)  # the trace holds the only other reference to its clock
    gc.disable()
    try:
        with speedups.trace(clock=wall) as t:
            with speedups.stage("infer"):
                with speedups.stage("to_host"):
                    clock.advance(1)
        del wall, t
        assert gone() is None  # no trace <-> span cycle left for the collector
    finally:
        gc.enable()


def test_the_twins_fixture_runs_each_twin(speedups):
    from servescope import recorder

    assert speedups.module.__name__ == {"c": "servescope._speedups", "python": "servescope._speedups_py"}[speedups.name]
    assert issubclass(speedups.Stage, speedups.module.StageBase)
    assert issubclass(speedups.Trace, speedups.module.TraceBase)
    assert type(speedups.stage("infer")) is speedups.Stage and speedups.stage is speedups.module.stage
    assert recorder.fold_rows is speedups.module.fold_rows

