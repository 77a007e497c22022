"""The doctor on any route: the route's own method, query strings, form uploads, a
``servescope.Model``, and bad arguments refused before anything runs.

(No ``from __future__ import annotations``: FastAPI reads the routes' annotations.)"""


import time
import io

import numpy as np
import pytest

from servescope.cli import main
from servescope.doctor import DoctorOptions, diagnose
from servescope.doctor.inputs import vary
from servescope.doctor.send import Send, allowed_methods, route_method
from servescope.exceptions import ConfigError

FAST = dict(requests=4, concurrency=2, concurrent_requests=4, timeout_s=5.0, experiment_seconds=0)


def png(value: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), value, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


# -- the method --------------------------------------------------------------------------------

ROUTES = [("/embed", ["PUT"]), ("/items/{item_id}", ["GET", "POST"]), ("/files/{p:path}", ["GET"]), ("/u/<int:uid>", ["DELETE"])]


def test_the_routes_own_method_is_the_default():
    body = Send.of({"x": 1}, path="/embed")
    assert route_method(ROUTES, body, None) == "PUT"
    assert route_method(ROUTES, Send.of({"x": 1}, path="/items/3"), None) == "POST"
    assert route_method(ROUTES, Send.of(path="/items/3?q=cat"), None) == "GET"  # no body: the GET of the pair
    assert route_method(ROUTES, Send.of(path="/u/7"), None) == "DELETE"
    assert route_method([], body, None) == "POST"  # an app that lists no routes: POST with a body ...
    assert route_method([], Send.of(path="/search?q=cat"), None) == "GET"  # ... GET without
    assert route_method([("/any", [])], Send.of({"x": 1}, path="/any"), None) == "POST"  # a route that lists no methods takes any
    assert route_method([("/both", ["DELETE", "PUT"])], Send.of({"x": 1}, path="/both"), None) == "PUT"


def test_a_method_the_route_does_not_take_names_those_it_does():
    with pytest.raises(ConfigError, match="/embed does not take POST: it takes PUT"):
        route_method(ROUTES, Send.of({"x": 1}, path="/embed"), "POST")
    with pytest.raises(ConfigError, match="GET .* with a body"):
        route_method(ROUTES, Send.of({"x": 1}, path="/files/a/b.txt"), None)
    with pytest.raises(ConfigError, match="PUT /embed takes a body"):
        route_method(ROUTES, Send.of(path="/embed"), None)


def test_route_patterns_of_starlette_and_flask():
    assert allowed_methods(ROUTES, "/files/a/b/c.txt") == ["GET"]
    assert allowed_methods(ROUTES, "/items/3/extra") is None
    assert allowed_methods(ROUTES, "/u/12?x=1") == ["DELETE"]


# -- the varied request -------------------------------------------------------------------------


def test_a_query_strings_free_text_and_decimals_are_varied_its_ids_switches_and_codes_stay():
    other, why = Send.of(path="/search?q=red+shoes&k=5&t=0.5&stream=false&lang=en&n=nan").varied()
    assert other is not None and other.path == "/search?q=red+shoes+and+more&k=5&t=0.515&stream=false&lang=en&n=nan"
    assert Send.of(path="/items?id=7&lang=en").varied() == (None, "the request has no text, decimal number, array or image to vary")
    assert Send.of(path="/items?q=a%20b&id=7").varied()[0].path != "/items?q=a%20b&id=7"  # (varied: "a b" is text)
    assert Send.of(path="/items?id=%37").varied()[0] is None  # re-encoded alike is not a change


def test_uploaded_images_and_text_are_varied_and_other_files_are_said():
    from PIL import Image

    send = Send.of(files=[("image", "cat.png", png(10)), ("notes", "n.txt", b"a cat\n")])
    other, _ = send.varied()
    # another body under the same Content-Type (the endpoint sends every body with the first one's)
    assert other is not None and other.body != send.body and other.content_type == send.content_type
    image = dict((f, d) for f, _, d in other.files)["image"]
    assert np.asarray(Image.open(io.BytesIO(image))).max() == 245  # a band of pixels inverted, still a PNG
    assert dict((f, d) for f, _, d in other.files)["notes"] == b"a cat and more\n"
    none, why = Send.of(files=[("blob", "w.bin", b"\x00\x01\x02")]).varied()
    assert none is None and "neither images nor text" in why


def test_an_uploaded_table_has_its_decimals_nudged_or_a_row_more_never_a_word_in_a_number():
    csv = b"tenure,fee,plan,late\n17,41.93,pro,0\n6,20.18,plus,1\n"
    other, _ = Send.of(files=[("customers", "c.csv", csv)]).varied()
    varied = dict((f, d) for f, _, d in other.files)["customers"]
    assert varied == b"tenure,fee,plan,late\n17,42.3593,pro,0\n6,20.3918,plus,1\n"  # (its last cell stays a number)
    ints = b"a\tb\n1\t2\n3\t4\n"
    assert dict((f, d) for f, _, d in Send.of(files=[("t", "t.tsv", ints)]).varied()[0].files)["t"] == b"a\tb\n1\t2\n3\t4\n3\t4\n"
    ragged = b"a, b\nhello, world, again\n"  # (not a table: a word added as before)
    assert dict((f, d) for f, _, d in Send.of(files=[("n", "n.txt", ragged)]).varied()[0].files)["n"] == b"a, b\nhello, world, again and more\n"


def test_arrays_of_whole_numbers_are_varied_within_their_range():
    pixels = [3, 9, 4, 7, 5, 6, 8, 2]
    out = vary({"pixels": pixels, "k": 5, "ids": [1, 2], "mask": [1] * 8})
    assert out["k"] == 5 and out["ids"] == [1, 2] and out["pixels"] != pixels and out["mask"] == [1] * 8
    assert min(pixels) <= min(out["pixels"]) and max(out["pixels"]) <= max(pixels) and len(out["pixels"]) == 8


# -- real apps ------------------------------------------------------------------------------------


def fastapi_app():
    from fastapi import FastAPI, File, UploadFile

    app = FastAPI()
    seen: dict[str, object] = {}

    @app.put("/v1/embed")
    def embed(body: dict) -> dict:
        seen["put"] = body
        return {"n": len(body["text"])}

    @app.get("/search")
    def search(q: str, k: int = 3) -> dict:
        seen["get"] = (q, k)
        return {"hits": [q] * k}

    @app.post("/classify")
    async def classify(image: UploadFile = File(...)) -> dict:
        raw = await image.read()
        seen["upload"] = (image.filename, len(raw))
        return {"bytes": len(raw)}

    return app, seen


def test_a_put_route_is_diagnosed_with_its_own_method():
    app, seen = fastapi_app()
    rep = diagnose(app, payload={"text": "hello"}, options=DoctorOptions(path="/v1/embed", **FAST))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors and seen["put"]["text"].startswith("hello")
    assert rep.latency["count"] >= 4


def test_a_get_route_takes_its_input_in_the_query_string():
    app, seen = fastapi_app()
    rep = diagnose(app, options=DoctorOptions(path="/search?q=red+shoes&k=2", **FAST))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors and seen["get"] == ("red shoes", 2)
    assert "repeated" not in rep.extra["evidence"]["missing"]  # the varied request (its query varied) was answered


def test_an_upload_route_gets_the_file_as_a_form(tmp_path):
    app, seen = fastapi_app()
    image = tmp_path / "cat.png"
    image.write_bytes(png())
    rep = diagnose(app, options=DoctorOptions(path="/classify", files=(("image", str(image)),), **FAST))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors and seen["upload"][0] == "cat.png"
    assert "repeated" not in rep.extra["evidence"]["missing"]  # the varied upload (pixels changed) was answered


def test_a_flask_put_route():
    from flask import Flask, request

    app = Flask("put")

    @app.route("/score", methods=["PUT"])
    def score():
        return {"n": len(request.get_json()["x"])}

    rep = diagnose(app, payload={"x": [1, 2]}, options=DoctorOptions(path="/score", **FAST))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors


def test_a_flask_apps_requests_run_on_reused_threads_each_in_a_context_of_its_own():
    """As gunicorn's and waitress's threads are reused: a thread made for every request costs
    what the served process never pays (an ONNX Runtime session built per request: 3-6 ms)."""
    import contextvars
    import threading

    from flask import Flask

    from servescope.doctor.endpoints.http import WSGIEndpoint

    app, threads, leaked = Flask("pool"), set(), []
    mark: contextvars.ContextVar[int] = contextvars.ContextVar("mark", default=0)

    @app.route("/predict", methods=["POST"])
    def predict():
        threads.add(threading.current_thread())  # (the object: a new thread may reuse an old one's ident)
        leaked.append(mark.get())  # set by an earlier request on the same thread: must not be seen
        mark.set(len(leaked))
        return {"ok": True}

    ep = WSGIEndpoint(app, "/predict")
    ep.start(5.0)
    try:
        obs = [ep.request(b"{}", 5.0) for _ in range(12)]
    finally:
        ep.stop()
    assert all(o.error is None for o in obs), [o.error for o in obs]
    # (a new thread each time would be 12; a worker that returns to the pool just after its answer
    # is read may be joined by another now and then on a busy machine)
    assert len(leaked) == 12 and len(threads) <= 6 and set(leaked) == {0}, (threads, leaked)


def test_a_method_the_route_does_not_take_is_refused_before_any_request():
    app, seen = fastapi_app()
    with pytest.raises(ConfigError, match="does not take POST: it takes PUT"):
        diagnose(app, payload={"text": "x"}, options=DoctorOptions(path="/v1/embed", method="POST", **FAST))
    assert seen == {}


def test_a_servescope_model_is_diagnosed_as_serve_serves_it():
    from servescope.serve import Model

    class Doubler(Model):
        def load(self, device):
            return 2

        def infer(self, batch):
            return [x * self.model for x in batch]

    rep = diagnose(Doubler, payload=3, options=DoctorOptions(**FAST))
    assert rep.extra["verdict"]["diagnosed"] and not rep.errors


def test_a_route_the_app_lacks_is_named_with_the_method_that_fits():
    app, _ = fastapi_app()
    rep = diagnose(app, payload={"text": "x"}, options=DoctorOptions(path="/v2/embed", method="PUT", **FAST))
    verdict = rep.extra["verdict"]
    assert not verdict["diagnosed"] and "PUT /v1/embed" in verdict["routes"]
    assert verdict["hint"] == "the app has no PUT route at /v2/embed: try --path /v1/embed"


# -- the command line ----------------------------------------------------------------------------


def exit_code(args):
    try:
        return main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--file", "image=/no/such/cat.png"], "no such file"),
        (["--method", "GET", "--body", "{body}"], "GET with a body"),
        (["--body", "{body}", "--file", "image={body}"], "does not go with --body"),
        (["--file", "image"], "expected FIELD=PATH"),
        (["--method", "TRACE"], "invalid choice"),
    ],
)
def test_bad_route_arguments_are_one_line_and_exit_2(tmp_path, capsys, extra, message):
    app = tmp_path / "app.py"
    app.write_text("raise SystemExit('imported')\n")  # never reached: refused before the target loads
    body = tmp_path / "b.json"
    body.write_text('{"x": 1}')
    args = ["doctor", f"{app}:app", *[a.format(body=body) for a in extra]]
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert message in lines[-1] and (len(lines) == 1 or lines[0].startswith("usage:"))  # (argparse adds its usage line)


# -- streamed answers -------------------------------------------------------------------------------


def test_a_streamed_answers_first_chunk_and_gaps_are_in_the_figures():
    import time

    from fastapi.responses import StreamingResponse

    from servescope.renderers.doctor import doctor_sections

    def tokens(payload):
        for i in range(4):
            time.sleep(0.02)  # a token every 20 ms
            yield f"t{i} "

    app, _ = fastapi_app()

    @app.post("/generate")
    def generate(body: dict):
        return StreamingResponse(tokens(body), media_type="text/plain")

    for target, path in ((tokens, "/predict"), (app, "/generate")):
        rep = diagnose(target, payload={"prompt": "hi"}, options=DoctorOptions(path=path, **FAST))
        warm = rep.extra["evidence"]["warm"]
        assert 19.0 <= warm["first_chunk_p50_ms"] < 1000 and 19.0 <= warm["chunk_gap_p50_ms"] < 1000, warm
        assert warm["chunk_gap_p95_ms"] >= warm["chunk_gap_p50_ms"]
        text = " ".join(str(getattr(x, "plain", "")) for x in doctor_sections(rep))
        assert "Streamed answers at c=1: first chunk p50" in text and "gaps between chunks p50" in text and "at c=2" in text


def _until(cond, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.001)
    return cond()


def test_the_next_request_goes_to_the_thread_that_came_free_last_and_none_is_lost_at_the_pools_size():
    """One caller's requests in turn run on one thread, as a server's worker takes them (threads
    taken in turn put an ONNX Runtime session on its pinned threads' core about a third of
    the time); at the pool's size a job waits for the next thread to come free."""
    import threading

    from servescope.doctor.endpoints.function import DaemonPool

    pool = DaemonPool(3)
    gates = [threading.Event() for _ in range(4)]
    busy = [pool.submit(lambda g=g: (g.wait(10), threading.current_thread())[1]) for g in gates]  # (the fourth waits)
    assert _until(lambda: len(pool._threads) == 3) and not busy[3].done()
    for i in (0, 1, 2):  # the first three come free in turn; the first of them takes the waiting job
        gates[i].set()
        assert busy[i].result(10) is not None
    assert _until(lambda: len(pool._idle) == 2)  # (the second and third back before the first is done)
    gates[3].set()
    assert busy[3].result(10) is busy[0].result()
    assert _until(lambda: len(pool._idle) == 3)  # (each back once its job is done)
    last = busy[3].result()  # (it came free last: after the third)
    ran = []
    for _ in range(6):
        ran.append(pool.submit(threading.current_thread).result(10))
        assert _until(lambda: len(pool._idle) == 3)  # (back before the next is sent, as a caller's next request waits for the answer)
    assert ran == [last] * 6
    pool.shutdown()
    assert _until(lambda: not any(t.is_alive() for t in pool._threads))


def test_a_wsgi_apps_requests_at_once_each_get_a_thread_and_every_thread_ends_with_the_server():
    """The thread waiting on the socket hands it on before it serves: requests that come at
    once run at once, on as many threads, and stopping the server ends them all."""
    import threading

    from flask import Flask

    from concurrent.futures import ThreadPoolExecutor

    from servescope.doctor.endpoints.client import send_one
    from servescope.doctor.endpoints.http import WSGIEndpoint

    app, threads = Flask("at_once"), set()

    @app.route("/predict", methods=["POST"])
    def predict():
        threads.add(threading.current_thread())
        time.sleep(0.5)
        return {"ok": True}

    ep = WSGIEndpoint(app, "/predict")
    ep.start(5.0)
    try:
        with ThreadPoolExecutor(8) as callers:
            t0 = time.perf_counter()
            sent = list(callers.map(lambda _: send_one("127.0.0.1", ep.port, "POST", "/predict", b"{}", {}, 10.0), range(8)))
            elapsed = time.perf_counter() - t0
        server = ep._server
    finally:
        ep.stop()
    assert all(s.status == 200 for s in sent), sent
    assert len(threads) == 8 and elapsed < 3.0  # (one after another: 4 s)
    assert _until(lambda: not any(w.thread.is_alive() for w in server._workers))


def test_a_flask_view_that_calls_sys_exit_fails_its_request_and_the_next_ones_are_served():
    import sys

    from flask import Flask

    from servescope.doctor.endpoints.http import WSGIEndpoint

    app, calls = Flask("exits"), []

    @app.route("/predict", methods=["POST"])
    def predict():
        calls.append(1)
        if len(calls) == 1:
            sys.exit(3)
        return {"ok": True}

    ep = WSGIEndpoint(app, "/predict")
    ep.start(5.0)
    try:
        first, *rest = [ep.request(b"{}", 5.0) for _ in range(3)]
    finally:
        ep.stop()
    assert first.error is not None and first.error.startswith("HTTP 500")
    assert all(o.error is None and o.status == 200 for o in rest), rest
