import joblib
import numpy as np
import sklearn_per_request as before
from fastapi import FastAPI

pipe = joblib.load(before.PATH)
app = FastAPI()


@app.post("/score")
def score(payload: dict):
    X = np.asarray(payload["rows"], dtype=np.float64)
    return {"p": pipe.predict_proba(X)[:, 1].tolist()}
