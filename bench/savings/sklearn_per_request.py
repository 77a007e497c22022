"""A tabular scorer that loads its scikit-learn pipeline from disk on every request."""

import os
import tempfile

import joblib
import numpy as np
from fastapi import FastAPI

PATH = os.path.join(tempfile.gettempdir(), "servescope-savings-pipeline.joblib")
if not os.path.exists(PATH):
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 12))
    y = (X[:, 0] + X[:, 3] * X[:, 5] > 0).astype(int)
    pipe = make_pipeline(StandardScaler(), RandomForestClassifier(n_estimators=100, max_depth=12, random_state=0)).fit(X, y)
    joblib.dump(pipe, PATH + f".{os.getpid()}")
    os.replace(PATH + f".{os.getpid()}", PATH)
app = FastAPI()


@app.post("/score")
def score(payload: dict):
    pipe = joblib.load(PATH)
    X = np.asarray(payload["rows"], dtype=np.float64)
    return {"p": pipe.predict_proba(X)[:, 1].tolist()}
