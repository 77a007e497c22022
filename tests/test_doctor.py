"""The doctor in-process on small handlers: failures are data, bad input is one line."""

from __future__ import annotations

import time

import pytest

from servescope.cli import main
from servescope.doctor import DoctorOptions, diagnose

FAST = DoctorOptions(requests=5, concurrency=2, concurrent_requests=4, timeout_s=2.0)


def test_a_handler_that_raises_is_reported_not_fatal():
    def predict(payload):
        raise KeyError("text")

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.errors == {"KeyError": 5}
    assert rep.extra["endpoint_errors"] == ["KeyError: 'text'"]
    assert rep.findings == []


def test_a_handler_that_hangs_times_out_and_the_doctor_goes_on():
    def predict(payload):
        time.sleep(5)

    opts = DoctorOptions(requests=1, concurrency=1, concurrent_requests=1, timeout_s=0.2)
    rep = diagnose(predict, payload={}, options=opts)
    assert any(e.startswith("timeout") for e in rep.extra["endpoint_errors"])


def test_async_handlers_run_on_an_event_loop():
    async def predict(payload):
        return {"ok": True}

    rep = diagnose(predict, payload={}, options=FAST)
    assert rep.latency["count"] == 5 and not rep.errors


def exit_code(args):
    try:
        return main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "target, payload_text, message",
    [
        ("nope.py:predict", '{"x": 1}', "does not exist"),
        ("{file}:missing", '{"x": 1}', "has no 'missing'"),
        ("{file}:NUMBER", '{"x": 1}', "neither a callable handler nor an ASGI/WSGI app"),
        ("{file}:predict", "{not json", "is not valid JSON"),
        ("{file}", '{"x": 1}', "must look like path/to/file.py:name"),
        ("{broken}:predict", '{"x": 1}', "importing"),
    ],
)
def test_bad_targets_and_payloads_are_one_line_and_exit_2(tmp_path, capsys, target, payload_text, message):
    good = tmp_path / "handler.py"
    good.write_text("NUMBER = 3\n\ndef predict(payload):\n    return payload\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    payload = tmp_path / "payload.json"
    payload.write_text(payload_text)
    target = target.format(file=good, broken=broken)
    assert exit_code(["doctor", target, "--payload", str(payload)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_payload_is_one_line(tmp_path, capsys):
    assert exit_code(["doctor", "x.py:f"]) == 2
    assert "--payload" in capsys.readouterr().err
