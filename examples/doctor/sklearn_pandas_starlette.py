"""Cause: a scikit-learn endpoint (Starlette) that builds a pandas DataFrame and its
features row by row on every request: the feature building costs far more than predict."""

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

rng = np.random.default_rng(0)
COLUMNS = [f"f{i}" for i in range(24)]
model = LogisticRegression(max_iter=200).fit(rng.standard_normal((500, 24 * 3)), rng.integers(0, 2, 500))


def features(record):
    frame = pd.DataFrame([record] * 20, columns=COLUMNS)  # a window of 20 copies, as a rolling feature would
    out = {}
    for col in COLUMNS:
        out[col + "_mean"] = frame[col].rolling(5, min_periods=1).mean().iloc[-1]
        out[col + "_max"] = frame[col].max()
        out[col + "_z"] = (frame[col].iloc[-1] - frame[col].mean()) / (frame[col].std() + 1e-6)
    return pd.DataFrame([out])


async def predict(request):
    body = await request.json()
    record = {c: float(v) for c, v in zip(COLUMNS, body["x"])}
    x = features(record)
    proba = model.predict_proba(x.to_numpy())[0]
    return JSONResponse({"p": float(proba[1])})


app = Starlette(routes=[Route("/predict", predict, methods=["POST"])])
