from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import servescope
from servescope import StageError, WallClock, stage, trace
from servescope.exceptions import ConfigError, RecordError


def test_stages_time_their_blocks_and_the_rest_is_other(clock):
    with trace(clock=WallClock(clock.now)) as t:
        with stage("validate"):
            clock.advance(0.04)
        with stage("preprocess"):
            clock.advance(1.9)
        clock.advance(0.5)  # outside any stage
        with stage("infer"):
            clock.advance(3.2)
    assert t.durations_ms == pytest.approx({"validate": 0.04, "preprocess": 1.9, "infer": 3.2, "other": 0.5})
    assert t.total_ms == pytest.approx(5.64)
    assert list(t.durations_ms) == ["validate", "preprocess", "infer", "other"]


def test_durations_follow_the_request_path_not_the_call_order(clock):
    with trace(clock=WallClock(clock.now)) as t:
        for name in ("serialize", "custom", "infer", "load"):
            with stage(name):
                clock.advance(1)
    assert list(t.durations_ms) == ["load", "infer", "serialize", "custom"]


def test_nested_stage_time_is_not_counted_twice(clock):
    with trace(clock=WallClock(clock.now)) as t:
        with stage("preprocess"):
            clock.advance(1)
            with stage("to_device"):
                clock.advance(2)
            clock.advance(1)
    assert t.durations_ms == pytest.approx({"preprocess": 2.0, "to_device": 2.0})
    assert sum(t.durations_ms.values()) == pytest.approx(t.total_ms)


def test_repeated_stage_names_add_up(clock):
    with trace(clock=WallClock(clock.now)) as t:
        for _ in range(3):
            with stage("infer"):
                clock.advance(1.5)
    assert t.durations_ms == {"infer": pytest.approx(4.5)}


def test_decorator_on_sync_and_async_functions(clock):
    @stage("preprocess")
    def prep(x):
        clock.advance(2)
        return x + 1

    @stage("infer")
    async def infer(x):
        clock.advance(3)
        await asyncio.sleep(0)
        return x * 2

    assert prep.__name__ == "prep"

    async def handler():
        with trace(clock=WallClock(clock.now)) as t:
            y = await infer(prep(1))
        return t, y

    t, y = asyncio.run(handler())
    assert y == 4
    assert t.durations_ms == pytest.approx({"preprocess": 2.0, "infer": 3.0})


def test_a_decorated_generator_times_each_item_it_makes_not_the_consumer(clock):
    @stage("postprocess")
    def tokens(n):
        for i in range(n):
            clock.advance(2)  # making an item
            yield i
        clock.advance(1)  # the end
        return "done"

    assert inspect.isgeneratorfunction(tokens)  # FastAPI's `yield` dependencies check this

    with trace(clock=WallClock(clock.now)) as t:
        out = []
        for item in tokens(3):
            out.append(item)
            clock.advance(10)  # the consumer (writing the chunk): not the generator's time
    assert out == [0, 1, 2]
    assert t.durations_ms == pytest.approx({"postprocess": 7.0, "other": 30.0})

    def consume():
        return (yield from tokens(1))

    with trace(clock=WallClock(clock.now)):
        gen = consume()
        next(gen)
        with pytest.raises(StopIteration) as stop:
            next(gen)
    assert stop.value.value == "done"  # the return value comes through


def test_a_decorated_generator_passes_send_throw_and_close_through(clock):
    log = []

    @stage("postprocess")
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
        @stage("infer")
        def stream(self, n):
            yield from range(n)

    with trace(clock=WallClock(clock.now)) as t:
        gen = echo()
        assert next(gen) == "ready"
        assert gen.send(21) == 42
        assert gen.throw(ValueError("bad chunk")) == "caught bad chunk"
        assert gen.send(1) == 2
        gen.close()
        assert list(Model().stream(2)) == [0, 1]  # methods bind as before
    assert log == ["closed"]
    assert t.durations_ms["postprocess"] == pytest.approx(4.0)

    @stage("postprocess")
    def broken():
        yield 1
        raise RuntimeError("stream broke")

    with pytest.raises(RuntimeError, match="stream broke"), trace(clock=WallClock(clock.now)) as t:
        list(broken())
    assert t.error == "RuntimeError: stream broke"


def test_a_decorated_async_generator_times_each_item(clock):
    closed = []

    @stage("postprocess")
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
        with trace(clock=WallClock(clock.now)) as t:
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

    @stage("postprocess")
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


def test_async_with_form(clock):
    async def handler():
        async with trace(clock=WallClock(clock.now)) as t:
            async with stage("infer"):
                clock.advance(1)
        return t

    assert asyncio.run(handler()).durations_ms == {"infer": pytest.approx(1.0)}


def test_outside_a_trace_stages_record_nothing_and_never_fail():
    assert servescope.current_trace() is None
    with stage("infer") as s:
        pass
    assert s.name == "infer"

    @stage("postprocess")
    def f():
        return 42

    assert f() == 42


def test_stage_in_a_thread_started_with_the_context_lands_in_the_request(clock):
    with trace(clock=WallClock(clock.now)) as t:
        ctx = contextvars.copy_context()

        def work():
            with stage("preprocess"):
                clock.advance(2)

        th = threading.Thread(target=ctx.run, args=(work,))
        th.start()
        th.join()
    assert t.durations_ms["preprocess"] == pytest.approx(2.0)


def test_thread_without_the_context_does_not_leak_into_the_request(clock):
    with trace(clock=WallClock(clock.now)) as t:
        th = threading.Thread(target=lambda: stage("stray").__enter__())
        th.start()
        th.join()
    assert "stray" not in t.durations_ms


def test_to_thread_and_tasks_carry_the_trace(clock):
    async def handler():
        with trace(clock=WallClock(clock.now)) as t:

            def blocking():
                with stage("infer"):
                    clock.advance(4)

            await asyncio.to_thread(blocking)

            async def post():
                with stage("postprocess"):
                    clock.advance(1)

            await asyncio.create_task(post())
        return t

    t = asyncio.run(handler())
    assert t.durations_ms == pytest.approx({"infer": 4.0, "postprocess": 1.0})


def test_concurrent_requests_keep_their_own_stages():
    async def request(name: str, delay: float):
        with trace() as t:
            with stage(name):
                await asyncio.sleep(delay)
        return t

    async def main():
        return await asyncio.gather(request("a", 0.01), request("b", 0.0), request("c", 0.005))

    ta, tb, tc = asyncio.run(main())
    assert set(ta.durations_ms) - {"other"} == {"a"}
    assert set(tb.durations_ms) - {"other"} == {"b"}
    assert set(tc.durations_ms) - {"other"} == {"c"}
    assert servescope.current_trace() is None


def test_the_trace_records_the_error_and_reraises(clock):
    with pytest.raises(KeyError):
        with trace(clock=WallClock(clock.now)) as t:
            with stage("validate"):
                clock.advance(1)
                raise KeyError("text")
    assert t.error == "KeyError: 'text'"
    assert t.durations_ms == {"validate": pytest.approx(1.0)}
    assert servescope.current_trace() is None


def test_a_trace_hands_itself_to_its_recorder(clock):
    rec = servescope.Recorder()
    with trace(clock=WallClock(clock.now), recorder=rec):
        with stage("infer"):
            clock.advance(2)
    assert len(rec.latency) == 1
    assert rec.stages["infer"].values().tolist() == [2.0]


@pytest.mark.parametrize("bad", [None, 3, "", b"infer", ["infer"]])
def test_a_stage_name_must_be_a_non_empty_string(bad):
    with pytest.raises(StageError, match="stage name must be a non-empty string"):
        stage(bad)


def test_add_takes_time_measured_elsewhere_and_rejects_bad_durations(clock):
    with trace(clock=WallClock(clock.now)) as t:
        t.add("queue", 2.5)
        with pytest.raises(RecordError, match="'queue'.*-1"):
            t.add("queue", -1)
        with pytest.raises(RecordError):
            t.add("queue", float("nan"))
        clock.advance(1)
    assert t.durations_ms["queue"] == pytest.approx(2.5)  # the good value survived


def test_a_trace_cannot_start_twice_or_finish_unstarted():
    t = trace()
    with pytest.raises(ConfigError, match="never started"):
        t.finish()
    with t:
        pass
    with pytest.raises(ConfigError, match="already started"):
        t.start()


def test_trace_takes_keyword_arguments_and_says_so():
    params = inspect.signature(servescope.trace).parameters
    assert list(params) == ["cuda", "clock", "recorder"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    with pytest.raises(TypeError):
        trace("events")  # positional: refused, not taken as something else
    with pytest.raises(TypeError, match="bogus"):
        trace(bogus=1)


def test_unknown_cuda_mode_is_a_clear_error():
    with pytest.raises(ConfigError, match="cuda must be"):
        trace(cuda="fast")  # type: ignore[arg-type]


def test_auto_mode_uses_host_clock_when_cuda_is_not_initialized():
    with trace() as t:
        pass
    assert t.clock.name == "wall"


def test_auto_mode_follows_torchs_cuda_state(monkeypatch, gpu):
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
    assert trace().clock.name == "wall"
    fake_cuda._initialized = state["initialized"] = True  # a model moved to the GPU
    assert trace().clock.name == "events"
    assert trace(cuda="wall").clock.name == "wall"
    state["bad_fork"] = True  # a forked worker of a parent that used CUDA: CUDA unusable here
    assert trace().clock.name == "wall"


def test_stages_enter_and_exit_in_c_where_the_extension_builds():
    import servescope.timing as timing

    if sys.platform.startswith("linux") and not os.environ.get("SERVESCOPE_NO_SPEEDUPS"):  # `make test` builds it
        assert timing.SPEEDUPS and timing.Stage.__mro__[1].__module__ == "servescope._speedups"
        assert timing.Trace.__mro__[1].__module__ == "servescope._speedups"


def test_the_pure_python_stages_pass_the_same_tests(tmp_path):
    """The fallback (no compiler, or SERVESCOPE_NO_SPEEDUPS=1) is held to the same behaviour:
    stages, traces and the recorder's fold."""
    env = {**os.environ, "SERVESCOPE_NO_SPEEDUPS": "1"}
    files = [str(Path(__file__).parent / name) for name in ("test_timing.py", "test_cuda_timing.py", "test_middleware.py", "test_recorder.py")]
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not pure_python", *files],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:]
    assert " passed" in p.stdout


def test_equal_names_held_by_different_stage_objects_add_up(clock):
    from servescope.timing import Stage

    a, b = Stage("".join(["de", "code"])), Stage("decode")  # equal names, two string objects
    with trace(clock=WallClock(clock.now)) as t:
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


def test_stage_objects_made_per_request_are_not_cached_without_bound(clock):
    from servescope import timing

    try:
        for i in range(timing._MAX_SHARED + 100):
            stage(f"dynamic_{i}")
        assert len(timing._STAGES) <= timing._MAX_SHARED
        name = f"dynamic_{timing._MAX_SHARED + 50}"
        with trace(clock=WallClock(clock.now)) as t:
            with stage(name):  # uncached: still timed
                clock.advance(2)
        assert t.durations_ms == {name: 2.0}
    finally:
        for key in [k for k in timing._STAGES if k.startswith("dynamic_")]:
            del timing._STAGES[key]
