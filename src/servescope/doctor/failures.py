"""The endpoint's own exceptions, as its server logged them, for the report.

An app served by the doctor (uvicorn, Flask) answers a failing request with a 500 or cuts its
stream: the client sees ``HTTP 500`` or ``connection reset``, the reason is in the server's
log. ``ExceptionLog`` listens to those loggers for the run and keeps each distinct exception
once, with where in the user's code it was raised, and names the known causes:

    with ExceptionLog() as log:
        ... requests ...
    log.summaries()     # ["RuntimeError: Inference tensors cannot be saved ... (app.py:22 tokens) x5"]
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

__all__ = ["ExceptionLog", "KNOWN_FAILURES", "known_failure"]

#: Loggers the servers the doctor runs write a failed request's exception to (uvicorn's, and
#: the root one that Flask's app logger and most apps' own logging reach).
LOGGERS = ("uvicorn.error", "")
#: distinct exceptions kept
MAX_KEPT = 5

#: Exceptions whose cause is known: (text in the message, or texts that must all be in it; the
#: fix: its cause in comments, then code).
KNOWN_FAILURES: tuple[tuple[str | tuple[str, ...], str], ...] = (
    (
        ("'numpy.", "is not iterable"),
        "# the answer holds numpy values (np.int64, np.float32, an array), which FastAPI's JSON encoder\n"
        "# cannot encode: a 500 after the model ran. Return Python values:\n"
        "return {'y_pred': prediction[0].item()}            # or float(...), int(...), array.tolist()",
    ),
    (
        "Inference tensors cannot be saved for backward",
        "# torch.inference_mode() is per thread, and a StreamingResponse's generator is resumed on\n"
        "# whichever thread is free: a `with torch.inference_mode():` around the loop (and its yield)\n"
        "# covers only the thread of the first step\n"
        "for _ in range(max_tokens):\n"
        "    with torch.inference_mode():         # around each step's forward, not around the yield\n"
        "        out = model(input_ids=ids, past_key_values=cache, use_cache=True)\n"
        "    ...\n"
        "    yield text",
    ),
    (
        "Already borrowed",
        "# a fast tokenizer (Rust) used from several threads at once: give each thread its own copy\n"
        "tokenizer = copy.deepcopy(TOKENIZER)   # per worker thread (threading.local), or guard the call with a lock",
    ),
    (
        "CUDA out of memory",
        "# concurrent requests each holding activations on the GPU: cap the requests in flight, or batch them\n"
        "app = servescope.serve(MyModel(), max_batch_size=8, max_queue=64)",
    ),
)


def known_failure(text: str) -> str | None:
    """The known cause and fix of an exception, from its text, or None."""
    return next((fix for needle, fix in KNOWN_FAILURES if all(n in text for n in ((needle,) if isinstance(needle, str) else needle))), None)


class ExceptionLog(logging.Handler):
    """Keeps the exceptions (records with ``exc_info``) logged while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: dict[str, int] = {}
        self._last: logging.LogRecord | None = None

    def __enter__(self) -> ExceptionLog:
        for name in LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        info = record.exc_info
        if not info or info[1] is None or record is self._last:  # (a record that propagates reaches us twice)
            return
        self._last = record
        try:
            text = summary(info[1])
        except Exception:  # never let the endpoint's failure become ours
            return
        if text in self.seen or len(self.seen) < MAX_KEPT:
            self.seen[text] = self.seen.get(text, 0) + 1

    def summaries(self) -> list[str]:
        return [f"{text} x{n}" if n > 1 else text for text, n in self.seen.items()]

    def take_since(self, before: dict[str, int]) -> list[str]:
        """The exceptions logged since ``before`` (a copy of ``seen``), taken out of ``seen``:
        what a request of the doctor's own raised, said with it, not as the endpoint's failure."""
        new = [text for text, n in self.seen.items() if n > before.get(text, 0)]
        for text in new:
            if before.get(text):
                self.seen[text] = before[text]
            else:
                del self.seen[text]
        return new


#: where code is not the user's: installed libraries, the standard library, and servescope itself
#: (its probes and middleware wrap the user's calls, and may be installed from a checkout)
_LIBS = tuple(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)) + (
    os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
)


def summary(exc: BaseException) -> str:
    """``Type: first line of the message (file.py:line function)``, the frame the innermost
    of the user's own code (not a library's or the standard library's)."""
    message = (str(exc).strip().splitlines() or [""])[0][:200]
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(_LIBS) and not frame.filename.startswith("<"):
            where = f" ({os.path.basename(frame.filename)}:{frame.lineno} {frame.name})"
            break
    return f"{type(exc).__name__}: {message}{where}"
