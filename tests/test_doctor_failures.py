"""The endpoint's own exceptions, from its server's log: each kept once with the user's line,
and a known one named with its fix."""

from __future__ import annotations

import logging
import textwrap

from servescope.doctor.failures import ExceptionLog, known_failure, summary
from servescope.rules import diagnose_evidence

from test_rules import healthy


def _raise_in_user_code():
    raise RuntimeError("Inference tensors cannot be saved for backward. Please do not use Tensors ...\nmore")


def test_exceptions_logged_by_the_server_are_kept_once_each_with_the_users_line():
    log = logging.getLogger("uvicorn.error")
    with ExceptionLog() as seen:
        for _ in range(3):
            try:
                _raise_in_user_code()
            except RuntimeError:
                log.error("Exception in ASGI application", exc_info=True)
        log.error("no exception attached")
        try:
            {}["k"]
        except KeyError:
            logging.getLogger("flask.app").exception("Exception on /predict [POST]")  # reaches the root logger
    log.error("after: not kept", exc_info=(ValueError, ValueError("x"), None))
    said = seen.summaries()
    assert len(said) == 2
    assert said[0].startswith("RuntimeError: Inference tensors cannot be saved for backward. Please do not use Tensors ...")
    assert "test_doctor_failures.py" in said[0] and "_raise_in_user_code" in said[0] and said[0].endswith(" x3")
    assert said[1].startswith("KeyError: 'k'")
    assert summary(ValueError("")) == "ValueError: "


def test_a_known_exception_gets_its_cause_and_fix_in_the_failing_requests_finding():
    assert "per thread" in known_failure("RuntimeError: Inference tensors cannot be saved for backward")
    assert known_failure("ZeroDivisionError: division by zero") is None
    numpy_answer = "ValueError: [TypeError(\"'numpy.int64' object is not iterable\"), TypeError('vars() argument must have __dict__ attribute')]"
    assert ".item()" in known_failure(numpy_answer) and known_failure("TypeError: 'numpy.int64' has no len()") is None
    ev = healthy(app_exceptions=["RuntimeError: Inference tensors cannot be saved for backward (app.py:22 tokens) x8"])
    ev.concurrent.errors = 8
    [f] = diagnose_evidence(ev).findings
    assert f.id == "failing-requests" and "app.py:22" in f.evidence["raised"] and "app.py:22" in f.detail
    assert "with torch.inference_mode():" in f.fix and "around each step's forward" in f.fix
    compile("def tokens():\n" + textwrap.indent(f.fix.replace("    ...\n", ""), "    "), "<fix>", "exec")
    ev.app_exceptions = ["ZeroDivisionError: division by zero (app.py:3 f)"]
    [f] = diagnose_evidence(ev).findings
    assert "not thread-safe" in f.fix and "ZeroDivisionError" in f.detail
