"""Healthy: a scikit-learn pipeline fitted once (FastAPI, a `def` endpoint); a request's
rows as one array, one predict_proba."""

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

rng = np.random.default_rng(1)
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)).fit(rng.standard_normal((400, 256)), rng.integers(0, 2, 400))
app = FastAPI()


class Rows(BaseModel):
    rows: list[list[float]]


@app.post("/predict")
def predict(body: Rows):
    p = model.predict_proba(np.asarray(body.rows, dtype=np.float32))[:, 1]
    return {"p": p.round(4).tolist()}
