"""Which stage a sampled stack is in, from its frames alone: the stage rules of ``doctor --pid``.

A stack is in a request when a server or framework frame (uvicorn, Starlette, Flask, gunicorn,
a thread pool) has the user's code below it, or a framework's request frame is on it (FastAPI
solving the body, serializing the answer). Outside a request a thread waits or keeps house,
and its time is nobody's. In a request, the outermost frame that a stage rule below matches
names the stage (a tokenizer inside ``encode`` is the model's call; ``torch.load`` inside a
handler is a load). Calls into C leave no frame: for the innermost line of the user's code the
line's own text is read (``pickle.load(``, ``.cuda(``, ``.cpu()``). User code that no rule
names is "other" here; requests.py splits it into pre- and postprocessing by where it ran.
"""

from __future__ import annotations

import linecache
import re
from pathlib import Path
from typing import Callable

from .trace import Frame

__all__ = ["LOAD_LABELS", "STAGE_FRAMES", "STAGE_LINES", "handler_index", "in_request", "is_library", "load_label", "package", "stage_of"]

_LIB = re.compile(r"(?:site-packages|dist-packages)/|/lib/python3(?:\.\d+)?/|^<frozen |^<")
_SITE = re.compile(r"(?:site-packages|dist-packages)/([^/]+)")
_STDLIB = re.compile(r"/lib/python3(?:\.\d+)?/([^/]+)")

#: Packages that serve requests rather than answer them: their frames above the user's code
#: mark where a request's work starts.
SERVERS = frozenset(
    "uvicorn starlette fastapi flask werkzeug gunicorn anyio asyncio concurrent threading socketserver http h11 "
    "httptools uvloop hypercorn ray litserve waitress sniffio click runpy selectors queue socket servescope "
    "sentry_sdk opentelemetry prometheus_client a2wsgi".split()
)
#: Frames of a framework's own request work (FastAPI solving the body, Flask dispatching):
#: a stack with one is in a request even when no user code is on it yet.
REQUEST_FRAMES = (
    ("starlette", "request_response."),
    ("fastapi", "get_request_handler."),
    ("fastapi", "serialize_response"),
    ("flask", "Flask.full_dispatch_request"),
    ("flask", "Flask.wsgi_app"),
    ("gunicorn", "handle_request"),
    # servescope.serve's own runtime: its request path, and its worker's batches (the model's
    # call may be the runtime's default infer, with no user frame on the stack)
    ("servescope", "ServeApp._predict"),
    ("servescope", "Runtime.process"),
)


#: servescope's own code wherever it is installed (an editable install is outside site-packages):
#: its runtime's threads serve requests, they are not the user's handler
_OURS = str(Path(__file__).resolve().parents[2]) + "/"


def is_library(file: str) -> bool:
    return bool(_LIB.search(file)) or not file or file.startswith(_OURS)


def package(file: str) -> str:
    """The top-level package (or standard-library module) a file belongs to; "" for user code."""
    if file.startswith(_OURS):
        return "servescope"
    m = _SITE.search(file) or _STDLIB.search(file)
    if not m:
        return ""
    return m.group(1).removesuffix(".py")


def _pkg_fn(pkg: str, *names: str) -> Callable[[Frame], bool]:
    def match(f: Frame) -> bool:
        return package(f.file) == pkg and (not names or any(n in f.name for n in names))

    return match


def _any(*tests: Callable[[Frame], bool]) -> Callable[[Frame], bool]:
    return lambda f: any(t(f) for t in tests)


def _file(fragment: str, *names: str) -> Callable[[Frame], bool]:
    return lambda f: fragment in f.file and (not names or any(n in f.name for n in names))


_SKLEARN_CALLS = ("predict", "transform", "decision_function", "kneighbors", "score_samples")
#: Each stage's frames, in the order they are tried on each frame.
STAGE_FRAMES: dict[str, Callable[[Frame], bool]] = {
    "load": _any(
        lambda f: "from_pretrained" in f.name,
        _file("torch/serialization.py", "load"),
        _file("torch/jit/_serialization.py"),
        _pkg_fn("torch", "load_state_dict"),
        _file("torch/nn/modules/", "__init__", "reset_parameters"),  # a model built (weights initialised)
        _pkg_fn("joblib", "load"),
        _pkg_fn("safetensors", "load"),
        _pkg_fn("sentence_transformers", "SentenceTransformer.__init__"),
        _pkg_fn("onnxruntime", "InferenceSession.__init__", "_create_inference_session"),
        _pkg_fn("pickle", "load"),
    ),
    "infer": _any(
        _file("torch/nn/modules/module.py", "_call_impl", "_wrapped_call_impl"),
        _pkg_fn("onnxruntime", ".run"),
        lambda f: package(f.file) == "sklearn" and f.name.rsplit(".", 1)[-1].startswith(_SKLEARN_CALLS),
        _pkg_fn("sentence_transformers", ".encode"),
        _pkg_fn("transformers", "Pipeline.__call__", ".generate"),
        _pkg_fn("xgboost", "predict", "inplace_predict"),
        _pkg_fn("lightgbm", "predict"),
    ),
    "preprocess": _any(
        _file("transformers/tokenization_utils"),
        _pkg_fn("tokenizers"),
        _pkg_fn("PIL"),
        _file("torchvision/transforms"),
        _pkg_fn("base64", "decode"),
    ),
    "validate": _any(
        _file("json/decoder.py"),
        _file("json/__init__.py", "loads", "load"),
        _pkg_fn("pydantic"),
        _file("fastapi/dependencies/"),
        _pkg_fn("starlette", "Request.json"),
        _pkg_fn("werkzeug", "get_json"),
        _pkg_fn("flask", "get_json"),
    ),
    "serialize": _any(
        _file("json/encoder.py"),
        _file("json/__init__.py", "dumps", "dump"),
        _pkg_fn("fastapi", "jsonable_encoder", "serialize_response"),
        _pkg_fn("starlette", "Response.render", "Response.__init__", "JSONResponse"),
        _file("flask/json/"),
        _pkg_fn("flask", "jsonify", "make_response"),
    ),
    "receive": _any(
        _pkg_fn("starlette", "Request.body", "Request.stream", "Request.form", "Request._get_form"),
        _pkg_fn("multipart"),
        _pkg_fn("python_multipart"),
        _file("werkzeug/formparser.py"),
        _pkg_fn("werkzeug", "get_data"),
        _file("gunicorn/http/", "parse", "Request.", "Parser."),
    ),
    "send": _any(
        _pkg_fn("starlette", "Response.__call__", "StreamingResponse"),
        _pkg_fn("uvicorn", ".send"),
        _file("werkzeug/serving.py", "write"),
        _file("gunicorn/http/wsgi.py", "write", "Response."),
    ),
}

#: A load's frame -> the name the load-once fixes know it by (rules/idioms.py), first match.
LOAD_LABELS: tuple[tuple[Callable[[Frame], bool], str], ...] = (
    (_file("torch/serialization.py", "load"), "torch.load"),
    (_file("torch/jit/_serialization.py"), "torch.jit.load"),
    (_pkg_fn("torch", "load_state_dict"), "load_state_dict"),
    (lambda f: "from_pretrained" in f.name and ("Tokenizer" in f.name or "tokeniz" in f.file), "AutoTokenizer.from_pretrained"),
    (lambda f: "from_pretrained" in f.name and "ImageProcessor" in f.name, "AutoImageProcessor.from_pretrained"),
    (lambda f: "from_pretrained" in f.name and "Processor" in f.name, "AutoProcessor.from_pretrained"),
    (lambda f: "from_pretrained" in f.name and "FeatureExtractor" in f.name, "AutoFeatureExtractor.from_pretrained"),
    (lambda f: "from_pretrained" in f.name and "Config" in f.name, "AutoConfig.from_pretrained"),
    (lambda f: "from_pretrained" in f.name, "from_pretrained"),
    (_pkg_fn("sentence_transformers", "SentenceTransformer.__init__"), "SentenceTransformer()"),
    (_pkg_fn("onnxruntime"), "onnxruntime.InferenceSession()"),
    (_pkg_fn("joblib"), "joblib.load"),
    (_pkg_fn("safetensors"), "safetensors.load_file"),
    (_pkg_fn("pickle"), "pickle.load"),
    (_file("torch/nn/modules/"), "nn.Module built"),
)
_LINE_LOADS = (("torch.load", "torch.load"), ("joblib.load", "joblib.load"), ("pickle.load", "pickle.load"), ("InferenceSession(", "onnxruntime.InferenceSession()"))


def load_label(frames: tuple[Frame, ...]) -> str:
    """What a stack in the load stage is loading, by the fixes' names."""
    for f in frames[_entry(frames) or 0 :]:
        for match, label in LOAD_LABELS:
            if match(f):
                return label
    text = line_text(frames[-1]) if frames else ""
    return next((label for key, label in _LINE_LOADS if key in text), "a load")


#: The text of the user's innermost line, for calls into C that leave no frame of their own.
STAGE_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("load", re.compile(r"\b(?:torch|joblib|pickle|cloudpickle|dill)\.loads?\(|\bload_file\(|\bInferenceSession\(")),
    ("to_device", re.compile(r"\.(?:to|cuda)\(|\.pin_memory\(")),
    ("to_host", re.compile(r"\.(?:cpu|numpy|tolist|item)\(\)")),
)


def handler_index(frames: tuple[Frame, ...]) -> int | None:
    """The user's outermost frame under the server's (the handler), or None."""
    seen_server = False
    for i, f in enumerate(frames):
        if is_library(f.file):
            seen_server = seen_server or package(f.file) in SERVERS
        elif seen_server:
            return i
    return None


def _entry(frames: tuple[Frame, ...]) -> int | None:
    """Where a request's own work starts on the stack: its handler, else the framework's
    request frame; None when the stack is in no request."""
    h = handler_index(frames)
    if h is not None:
        return h
    for i, f in enumerate(frames):
        if any(package(f.file) == pkg and f.name.startswith(prefix) for pkg, prefix in REQUEST_FRAMES):
            return i
    return None


def in_request(frames: tuple[Frame, ...]) -> bool:
    return _entry(frames) is not None


def line_text(f: Frame) -> str:
    return linecache.getline(f.file, f.line).strip() if f.file and f.line > 0 else ""


def stage_of(frames: tuple[Frame, ...]) -> str:
    """The stage of a stack in a request (see the module's notes); "other" when no rule names it."""
    for f in frames[_entry(frames) or 0 :]:
        for stage, match in STAGE_FRAMES.items():
            if match(f):
                return stage
    leaf = frames[-1] if frames else None
    if leaf is not None and not is_library(leaf.file):
        text = line_text(leaf)
        for stage, pattern in STAGE_LINES:
            if pattern.search(text):
                return stage
    return "other"
