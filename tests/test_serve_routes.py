"""Several models in one servescope.serve app, each at the route its clients call: each its own
runtime, one /ready, /metrics labelled by route, /report for all or one."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

import servescope
from servescope.exceptions import ConfigError
from servescope.serve.routes import label_exposition


class Double(servescope.Model):
    example = {"x": [1.0, 2.0]}

    def load(self, device):
        return lambda batch: batch * 2

    def preprocess(self, request):
        return torch.tensor(request["x"])

    def postprocess(self, output):
        return {"y": output.tolist()}


class Total(Double):
    def load(self, device):
        return lambda batch: batch.sum(-1)

    def postprocess(self, output):
        return {"total": float(output)}


def _calls(app, calls):
    async def go():
        await app.startup()
        assert await app.wait_ready(60) == "ready"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            out = [await client.request(m, p, json=b) for m, p, b in calls]
        await app.shutdown()
        return out

    return asyncio.run(go())


def test_each_route_answers_with_its_own_model_and_the_runtime_routes_cover_them_all():
    app = servescope.serve({"/v1/double": Double(), "/v1/total": Total()}, max_batch_size=4)
    double, total, wrong, ready, metrics, report, one, missing = _calls(app, [
        ("POST", "/v1/double", {"x": [1.0, 2.5]}),
        ("POST", "/v1/total", {"x": [1.0, 2.5]}),
        ("GET", "/v1/total", None),
        ("GET", "/ready", None),
        ("GET", "/metrics", None),
        ("GET", "/report", None),
        ("GET", "/report?route=/v1/total", None),
        ("POST", "/predict", {"x": [1.0]}),
    ])  # fmt: skip
    assert double.json() == {"y": [2.0, 5.0]} and total.json() == {"total": 3.5}
    assert "infer" in double.headers["server-timing"]
    assert wrong.status_code == 405
    assert ready.json() == {"ready": True, "state": "ready", "routes": {"/v1/double": "ready", "/v1/total": "ready"}}
    text = metrics.text
    assert 'servescope_requests_total{route="/v1/double"' in text and 'servescope_requests_total{route="/v1/total"' in text
    assert text.count("# TYPE servescope_requests_total ") == 1
    from prometheus_client.parser import text_string_to_metric_families

    routes = {s.labels.get("route") for f in text_string_to_metric_families(text) for s in f.samples}
    assert routes == {"/v1/double", "/v1/total"}  # every sample parses, and says its route
    assert json.loads(report.text)["latency"]["count"] == 2 and json.loads(one.text)["latency"]["count"] == 1
    assert missing.status_code == 404 and "POST /v1/double, POST /v1/total" in missing.json()["error"]


def test_routes_are_checked_when_the_app_is_made():
    with pytest.raises(ConfigError, match="at least one route"):
        servescope.serve({})
    with pytest.raises(ConfigError, match="own routes"):
        servescope.serve({"/metrics": Double()})
    with pytest.raises(ConfigError, match="its key"):
        servescope.serve({"/a": Double()}, path="/b")
    with pytest.raises(ConfigError, match="given twice"):
        servescope.serve({"POST /a": Double(), "PUT /a": Total()})
    with pytest.raises(ConfigError, match="methods must be among"):
        servescope.serve({"GET /a": Double()})
    app = servescope.serve({"POST /a": Double(), "PUT, PATCH /b": Total(), "/c": Double()}, methods=("PATCH",))
    assert {p: a.methods for p, a in app.apps.items()} == {"/a": ("POST",), "/b": ("PUT", "PATCH"), "/c": ("PATCH",)}


def test_samples_get_their_route_label_and_each_family_one_head():
    a = '# HELP m_total Requests\n# TYPE m_total counter\nm_total{status="ok"} 3.0\n# HELP g A gauge\n# TYPE g gauge\ng 1.0\n'
    b = '# HELP m_total Requests\n# TYPE m_total counter\nm_total{status="ok"} 5.0\n'
    out = label_exposition([("/a", a), ("/b", b)]).splitlines()
    assert out == ["# HELP m_total Requests", "# TYPE m_total counter", 'm_total{route="/a",status="ok"} 3.0', 'm_total{route="/b",status="ok"} 5.0',
                   "# HELP g A gauge", "# TYPE g gauge", 'g{route="/a"} 1.0']  # fmt: skip
