"""The doctor's child lends its main thread to the app's server, as uvicorn (its loop) and
gunicorn's sync worker (each request) use it: glibc's main heap costs a load per request
20-30% more than a thread's, and that is the saving the user banks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from servescope.doctor.endpoints.http import ASGIEndpoint, WSGIEndpoint
from servescope.doctor.endpoints.main_thread import MainThread, call_on_main_thread, on_main_thread
from servescope.doctor.endpoints.wsgi_server import LeaderWSGIServer


def lent(scenario: Callable[[], Any]) -> Any:
    """``scenario()`` on a thread while this, the main thread, is lent (as in the doctor's child)."""
    assert threading.current_thread() is threading.main_thread()
    host, out = MainThread.install(), {}

    def run() -> None:
        try:
            out["result"] = scenario()
        except BaseException as exc:  # noqa: B036 - raised again on the test's thread
            out["error"] = exc
        finally:
            host.close()

    t = threading.Thread(target=run)
    t.start()
    watchdog = threading.Timer(120.0, host.close)  # (a broken hand-off fails the test instead of hanging it)
    watchdog.start()
    host.host()
    watchdog.cancel()
    t.join(10.0)
    assert not t.is_alive() and ("result" in out or "error" in out), "the scenario did not end"
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_a_job_runs_on_the_main_thread_and_a_second_waits_for_none_while_the_first_holds_it():
    def scenario():
        release = threading.Event()
        first = on_main_thread(lambda: (threading.current_thread().name, release.wait(5)))
        assert first is not None and first.ident == threading.main_thread().ident and first.is_alive()
        second = on_main_thread(lambda: None)  # the main thread is taken: the caller uses a thread of its own
        release.set()
        first.join(5)
        return first.result[0], second, call_on_main_thread(lambda: threading.current_thread().name)

    name, second, again = lent(scenario)
    assert name == "MainThread" and second is None and again == "MainThread"
    assert on_main_thread(lambda: None) is None  # (nothing lent outside the child)


def test_an_error_on_the_main_thread_is_raised_to_the_caller():
    def fails():
        raise ValueError("the import failed")

    def scenario():
        try:
            call_on_main_thread(fails)
        except ValueError as exc:
            return str(exc)

    assert lent(scenario) == "the import failed"


class _SlowClose:
    """A body whose close() runs after the client has read it: the server is not done yet."""

    def __init__(self, body: bytes, close_s: float) -> None:
        self.body, self.close_s = body, close_s

    def __iter__(self):
        yield self.body

    def close(self) -> None:
        time.sleep(self.close_s)


def test_requests_one_at_a_time_all_run_on_the_main_thread_and_at_once_on_threads_of_their_own(monkeypatch):
    monkeypatch.setattr(LeaderWSGIServer, "MAIN_GRACE_S", 2.0)  # (a busy machine may keep the main thread from its close a while)
    names: list[str] = []

    def app(environ, start_response):
        names.append(threading.current_thread().name)
        if environ["PATH_INFO"] == "/slow":
            time.sleep(0.3)
        body = b'{"ok": true}'
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return _SlowClose(body, 0.02)  # (the next request comes while this one still closes)

    def scenario():
        ep = WSGIEndpoint(app, "/fast")
        ep.start(5.0)
        try:
            first = ep.one_by_one(b"{}", 10, 5.0, 30.0)
            ep.path = "/slow"
            ep.ready_load()  # (the helper process's start is not the requests' time)
            t0 = time.perf_counter()
            obs, _ = ep.concurrent(b"{}", 4, 4, 5.0, 30.0)
            at_once = time.perf_counter() - t0
            ep.path = "/fast"
            after = ep.one_by_one(b"{}", 5, 5.0, 30.0)
        finally:
            ep.stop()
        return first, obs, at_once, after

    first, obs, at_once, after = lent(scenario)
    assert all(o.error is None for o in [*first, *obs, *after])
    assert names[:10] == ["MainThread"] * 10, names[:10]
    assert len(set(names[10:14])) == 4 and at_once < 1.2, (names[10:14], at_once)
    assert names[14:] == ["MainThread"] * 5, names[14:]  # (back on the main thread once it is free)


def test_requests_after_one_the_main_thread_is_still_stuck_on_wait_for_it_once_then_go_to_other_threads(monkeypatch):
    monkeypatch.setattr(LeaderWSGIServer, "MAIN_GRACE_S", 1.0)
    names: list[str] = []
    stuck = threading.Event()

    def app(environ, start_response):
        names.append(threading.current_thread().name)
        if not stuck.is_set():
            stuck.set()
            time.sleep(4.0)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    def scenario():
        ep = WSGIEndpoint(app, "/p")
        ep.start(5.0)
        try:
            timed_out = ep.request(b"", 0.3)
            t0 = time.perf_counter()
            served = ep.one_by_one(b"", 3, 5.0, 30.0)
            return timed_out, served, time.perf_counter() - t0
        finally:
            ep.stop()

    timed_out, served, took = lent(scenario)
    assert timed_out.error is not None and all(o.error is None for o in served)
    assert names[0] == "MainThread" and "MainThread" not in names[1:], names
    # the first waited its grace (1 s) for the main thread; the two after it did not wait again
    assert 1.0 <= took < 2.5, took


def test_an_async_route_runs_on_the_main_threads_loop_and_a_plain_one_on_a_worker_thread():
    from fastapi import FastAPI

    app, where = FastAPI(), {}

    @app.post("/a")
    async def on_loop(body: dict) -> dict:
        where.setdefault("async", set()).add(threading.current_thread().name)
        return {}

    @app.post("/s")
    def in_pool(body: dict) -> dict:
        where.setdefault("sync", set()).add(threading.current_thread().name)
        return {}

    def scenario():
        ep = ASGIEndpoint(app, "/a")
        ep.start(10.0)
        try:
            assert ep.loop_thread_id == threading.main_thread().ident
            with ThreadPoolExecutor(2) as pool:
                got = [*ep.one_by_one(b"{}", 3, 5.0, 30.0), *pool.submit(ep.one_by_one, b"{}", 3, 5.0, 30.0, "/s").result()]
        finally:
            ep.stop()
        return got

    got = lent(scenario)
    assert all(o.status == 200 for o in got), [(o.status, o.error) for o in got]
    assert where["async"] == {"MainThread"} and "MainThread" not in where["sync"], where


def test_a_fresh_process_of_the_app_serves_it_on_its_main_thread_too(tmp_path):
    """The second first request (cold.py) is measured as the doctor's run measured the first."""
    from servescope.doctor.cold import repeat_first_request
    from servescope.doctor.options import DoctorOptions

    log = tmp_path / "threads.log"
    (tmp_path / "fresh_flask.py").write_text(
        "import threading\nfrom flask import Flask\napp = Flask(__name__)\n\n\n"
        "@app.post('/predict')\ndef predict():\n"
        f"    open({str(log)!r}, 'a').write(threading.current_thread().name + '\\n')\n"
        "    return {'ok': True}\n"
    )
    (tmp_path / "p.json").write_text("{}")
    first, p50, error = repeat_first_request(f"{tmp_path / 'fresh_flask.py'}:app", str(tmp_path / "p.json"), DoctorOptions(timeout_s=20.0))
    assert error is None and first and p50, (first, p50, error)
    names = log.read_text().split()
    # (each waits up to 0.25 s for the main thread to finish the last: a busy machine may take longer now and then)
    assert len(names) == 6 and names[0] == "MainThread" and names.count("MainThread") >= 4, names
