"""Models that arrive late: an endpoint that imports only joblib and unpickles its model inside
the handler (scikit-learn, LightGBM or XGBoost first imported there, after the probes were
installed) still has its model calls seen, timed as ``infer`` and named in its own idiom."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

TRAIN = """
import sys, joblib, numpy as np
rng = np.random.default_rng(0)
X = rng.normal(size=(400, 8)); y = (X[:, 0] + X[:, 1] > 0).astype(int)
kind, path = sys.argv[1], sys.argv[2]
if kind == "sklearn":
    from sklearn.ensemble import RandomForestClassifier as M; m = M(n_estimators=30)
elif kind == "lightgbm":
    from lightgbm import LGBMClassifier as M; m = M(n_estimators=30, verbose=-1)
else:
    from xgboost import XGBClassifier as M; m = M(n_estimators=30)
joblib.dump(m.fit(X, y), path)
"""

APP = """
import joblib
import numpy as np

def predict(payload):
    model = joblib.load({path!r})                      # its library is first imported here
    x = np.asarray(payload["x"], dtype=np.float64).reshape(1, -1)
    return {{"p": float(model.predict_proba(x)[0, 1])}}
"""


@pytest.mark.parametrize("kind, module, call", [
    ("sklearn", "sklearn", "RandomForestClassifier.predict_proba"),
    ("lightgbm", "lightgbm", "LGBMClassifier.predict_proba"),
    ("xgboost", "xgboost", "XGBClassifier.predict_proba"),
])  # fmt: skip
def test_a_model_library_first_imported_in_the_handler_is_probed(tmp_path, kind, module, call):
    pytest.importorskip(module)
    model = tmp_path / "model.joblib"
    subprocess.run([sys.executable, "-c", TRAIN, kind, str(model)], check=True, timeout=120)
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP.format(path=str(model))))
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"x": [0.1, -0.2, 0.3, 0.5, -1.0, 0.0, 0.2, 0.4]}))
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "servescope", "doctor", f"{app}:predict", "--body", str(body), "-n", "6", "-c", "2",
                        "--experiments", "0s", "--json", str(out)], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert p.returncode in (0, 1), p.stdout + p.stderr
    rep = json.loads(out.read_text())
    fwd = rep["diagnosis"]["evidence"]["warm"]["forwards"]
    assert fwd["count"] >= 6 and fwd["calls"] == [call] and fwd["kinds"] == ["scikit-learn"]
    found = {f["id"]: f for f in rep["findings"]}
    assert "joblib.load(PATH)" in found["model-load-per-request"]["fix"] and "torch" not in found["model-load-per-request"]["fix"]
    assert rep["stages"]["infer"]["share"] > 0.05
