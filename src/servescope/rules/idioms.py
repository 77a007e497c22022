"""Fix texts in the idiom of the stack the probes saw (torch, ONNX Runtime, scikit-learn,
sentence-transformers, transformers pipelines, tokenizers), not torch code on every stack."""

from __future__ import annotations

import re

__all__ = ["batch_fix", "load_once_fix", "repeated_fix", "warmup_fix"]

#: The line that loads each kind of model once, at start-up, in its own library's idiom.
_LOAD_ONCE = {
    "onnxruntime.InferenceSession()": 'SESSION = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])',
    "joblib.load": "MODEL = joblib.load(PATH)          # a scikit-learn pipeline: unpickled once",
    "pickle.load": "with open(PATH, 'rb') as f:\n    MODEL = pickle.load(f)",
    "AutoTokenizer.from_pretrained": "TOKENIZER = AutoTokenizer.from_pretrained(PATH)",
    "AutoConfig.from_pretrained": "CONFIG = AutoConfig.from_pretrained(PATH)",
    "AutoProcessor.from_pretrained": "PROCESSOR = AutoProcessor.from_pretrained(PATH)",
    "AutoImageProcessor.from_pretrained": "IMAGE_PROCESSOR = AutoImageProcessor.from_pretrained(PATH)",
    "AutoFeatureExtractor.from_pretrained": "FEATURE_EXTRACTOR = AutoFeatureExtractor.from_pretrained(PATH)",
    "from_pretrained": "MODEL = AutoModel.from_pretrained(PATH).eval()",
    "SentenceTransformer()": "MODEL = SentenceTransformer(PATH, device=device)",
    "transformers.pipeline": 'PIPE = pipeline("text-classification", model=PATH)',
    "torch.jit.load": "MODEL = torch.jit.load(PATH, map_location=device).eval()",
    "safetensors.load_file": "STATE = safetensors.torch.load_file(PATH)",
    "xgboost.Booster.load_model": "BOOSTER = xgboost.Booster()\nBOOSTER.load_model(PATH)",
    "lightgbm.Booster()": "BOOSTER = lightgbm.Booster(model_file=PATH)",
}
_TORCH_LOAD_ONCE = (
    "model = build_model()\n"
    "model.load_state_dict(torch.load(PATH, map_location=device))\n"
    "model.to(device).eval()"
)


def load_once_fix(load_calls: list[str]) -> str:
    """"Load once, at start-up" written for what this endpoint loads (ONNX Runtime, joblib,
    a tokenizer ...), not as torch code on every stack."""
    lines = [_LOAD_ONCE[c] for c in load_calls if c in _LOAD_ONCE]
    if not lines or any(c in ("torch.load", "load_state_dict") for c in load_calls) or not load_calls:
        lines.insert(0, _TORCH_LOAD_ONCE)  # (torch.load, load_state_dict, or a model built per request)
    lines = list(dict.fromkeys(lines))
    return "# load once, at start-up (module level, or the app's lifespan), not inside the handler\n" + "\n".join(lines) + (
        "\n\n# ... and in the handler, use what was loaded: nothing is read or built per request"
    )


#: one warm-up call per kind of model call the probes saw
_WARM_UP = {
    "torch": "with torch.inference_mode():\n    model(example_input)      # also each batch size you will use",
    "onnxruntime": "SESSION.run(None, {SESSION.get_inputs()[0].name: example})   # ONNX Runtime plans its memory on the first run",
    "scikit-learn": "MODEL.predict(example_rows)      # the first call imports and allocates what later ones reuse",
    "xgboost": "BOOSTER.inplace_predict(example_rows)",
    "lightgbm": "BOOSTER.predict(example_rows)",
    "sentence-transformers": 'MODEL.encode(["warm-up"])',
    "transformers.pipeline": 'PIPE("warm-up")',
}


def warmup_fix(kinds: list[str]) -> str:
    """Load and run one example at start-up, for the kinds of model calls seen."""
    calls = [_WARM_UP[k] for k in kinds if k in _WARM_UP] or [_WARM_UP["torch"]]
    load = "model = load_model()\n" if "torch" in kinds or not kinds else ""
    return (
        "# load and run one example at start-up, before the server reports ready\n"
        + load + "\n".join(calls) + "\n# servescope.serve(Model(), example=...) does both before /ready"
    )


#: "many requests' inputs in one call" in each library's idiom
_BATCH = {
    "torch": "x = torch.stack(inputs); y = model(x); outputs = list(y)",
    "onnxruntime": "(y,) = SESSION.run(None, {name: np.concatenate(rows)}); outputs = np.split(y, np.cumsum(sizes)[:-1])",
    "sentence-transformers": "vectors = MODEL.encode(all_texts, batch_size=32); outputs = np.split(vectors, np.cumsum(sizes)[:-1])",
    "transformers.pipeline": "outputs = PIPE(all_texts, batch_size=16)",
    "xgboost": "y = BOOSTER.inplace_predict(np.vstack(rows)); outputs = np.split(y, np.cumsum(sizes)[:-1])   # 16 rows cost about as much as 1",
    "lightgbm": "y = BOOSTER.predict(np.vstack(rows)); outputs = np.split(y, np.cumsum(sizes)[:-1])   # 16 rows cost about as much as 1",
}
#: scikit-learn's calls on texts (a vectoriser's input is a list of strings, not rows of numbers)
_TEXT_TRANSFORMERS = ("Vectorizer", "Hasher", "Transformer")


def _sklearn_batch(call: str, frames: bool = False) -> str:
    cls, _, method = call.partition(".")
    name = _snake(cls)
    if method == "transform" and cls.endswith(_TEXT_TRANSFORMERS):
        return f"x = {name}.transform(all_texts); outputs = [x[i:j] for i, j in zip(starts, ends)]   # one call for every request's texts"
    rows = "pd.concat(frames)" if frames else "np.vstack(rows)"  # (a frame's column names are what a ColumnTransformer selects by)
    return f"y = {name}.{method}({rows}); outputs = np.split(y, np.cumsum(sizes)[:-1])   # 16 rows cost about as much as 1"


def batch_fix(kinds: list[str], calls: list[str] | None = None, frames: bool = False) -> str:
    """Let concurrent requests share one model call, for the kinds of model calls seen (and,
    for scikit-learn, the estimator and method called: ``calls``; ``frames``: given pandas
    DataFrames, concatenated as frames)."""
    lines = [_BATCH[k] for k in kinds if k in _BATCH]
    if "scikit-learn" in kinds:
        lines += [_sklearn_batch(c, frames) for c in calls or []] or [_sklearn_batch("Model.predict_proba", frames).replace("model.", "MODEL.", 1)]
    lines = lines or [_BATCH["torch"]]
    return (
        "# let concurrent requests share one model call\n"
        "app = servescope.serve(MyModel(), max_batch_size=16)\n"
        "# or batch yourself: collect the requests that arrive within ~2 ms, then one call for all:\n"
        + "\n".join(lines)
    )


def _snake(name: str) -> str:
    """``TfidfVectorizer`` -> ``tfidf_vectorizer``: what the user's object is likely called."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower() or "model"


#: the call done once, at start-up, in each library's idiom (``{obj}``/``{method}``: the call seen)
_ONCE = {
    "torch": ("with torch.inference_mode():\n    CORPUS_OUT = model(**corpus_inputs)     # the fixed input's forward, once",
              "out = model(**request_inputs)           # only what the request changes"),
    "sentence-transformers": ("CORPUS_EMBEDDINGS = model.encode(CORPUS, convert_to_tensor=True)",
                              "query = model.encode([text], convert_to_tensor=True)   # only what the request changes\n"
                              "    scores = CORPUS_EMBEDDINGS @ query.T"),
    "onnxruntime": ("(FIXED_OUT,) = session.run(None, fixed_feed)      # the same feed every request: run it once",
                    "(out,) = session.run(None, request_feed)   # only what the request changes"),
    "transformers.pipeline": ("FIXED_OUT = pipe(FIXED_TEXTS)", "out = pipe(text)                         # only what the request changes"),
}


def repeated_fix(kinds: list[str], calls: list[str]) -> str:
    """"Compute it once" for the call that got the same input on every request, in its own
    library's idiom (a scikit-learn vectoriser's ``transform`` of a fixed corpus, an ONNX
    Runtime feed, an embedding of a fixed corpus ...)."""
    sk = [c for c in calls if "." in c] if "scikit-learn" in kinds else []
    if sk:
        cls, _, method = sk[0].partition(".")
        obj = _snake(cls)
        once = f"FIXED = {obj}.{method}(FIXED_INPUT)        # {cls}.{method} of the same input: once"
        per_request = f"x = {obj}.{method}(request_input)     # only what the request changes, then use FIXED"
    else:
        kind = next((k for k in kinds if k in _ONCE), "torch")
        once, per_request = _ONCE[kind]
    return (
        "# its inputs do not depend on the request: compute it once, at start-up (at import, or in the app's lifespan)\n"
        f"{once}\n\n"
        "def handler(request):\n"
        f"    {per_request}\n"
        "# or cache by input: functools.lru_cache on a function of hashable arguments"
    )
