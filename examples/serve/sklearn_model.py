"""A scikit-learn model on servescope.serve (no torch): rows of features in JSON, class
probabilities out; concurrent requests' rows scored in one ``predict_proba``.

    servescope serve examples/serve/sklearn_model.py:Churn --port 8000 --path /v1/score -X PUT
    curl -s -X PUT localhost:8000/v1/score -d '{"features": [0.2, 1.5, -0.3, 4.0]}'

Your model comes from a file (``joblib.load(PATH)`` in ``load``); this one is trained at load
on fixed synthetic data so the example runs anywhere.
"""

import numpy as np

import servescope

FEATURES = 4


class Churn(servescope.Model):
    example = {"features": [0.0] * FEATURES}

    def load(self, device):
        from sklearn.ensemble import RandomForestClassifier  # (your own: return joblib.load(PATH))

        rng = np.random.default_rng(0)
        x = rng.normal(size=(2000, FEATURES))
        y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
        return RandomForestClassifier(n_estimators=50, max_depth=8, n_jobs=1, random_state=0).fit(x, y)

    def validate(self, payload):
        features = payload.get("features") if isinstance(payload, dict) else None
        if not isinstance(features, list) or len(features) != FEATURES:
            raise servescope.InvalidPayload(f"features needs {FEATURES} numbers", field="features")
        return payload

    def preprocess(self, request):
        return np.asarray(request["features"], dtype=np.float64)  # one row; rows are stacked per batch

    def collate(self, inputs):
        return np.stack(inputs)  # a numpy batch (the default makes torch tensors when torch is there)

    def infer(self, batch):
        return self.model.predict_proba(batch)  # a numpy batch in, a numpy batch out: split per row

    def postprocess(self, output):
        return {"churn_probability": float(output[1])}
