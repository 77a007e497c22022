"""Cause: a LightGBM classifier (its scikit-learn API, saved with joblib) loaded inside the
handler, on every request. The file imports joblib only: LightGBM and scikit-learn are first
imported by ``joblib.load``, during a request, after the doctor's probes were set up."""

import os

import joblib
import numpy as np
from fastapi import FastAPI

MODEL_PATH = os.path.join(os.path.dirname(__file__), "gbm.joblib")
app = FastAPI()


@app.post("/score")
def score(body: dict):
    model = joblib.load(MODEL_PATH)  # read and unpickled again for every request
    x = np.asarray(body["features"], dtype=np.float64).reshape(1, -1)
    return {"probability": float(model.predict_proba(x)[0, 1])}
