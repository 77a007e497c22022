"""The report's JSON contract, checked on load: each field has the type docs/report-schema.md
gives it, or the report is refused with one ``ReportError`` that names the field.

    check_types(orjson.loads(text))      # raises ReportError("report field latency.p50_ms is ...")

A report may come from anywhere (``servescope report http://...``): everything the renderers
read is checked here once, so no view can fail half-way on a string where a number belongs.
Unknown fields are kept and not checked (new ones may appear within a schema version).
"""

from __future__ import annotations

from typing import Any, Callable

from .exceptions import ReportError

__all__ = ["check_types"]

Check = Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _list(v: Any) -> bool:
    return isinstance(v, list)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


_NAMES = {_number: "a number", _str: "a string", _object: "an object", _list: "an array", _bool: "true or false"}


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", dict: "an object", list: "an array"}.get(
        type(v), type(v).__name__
    )


def _expect(value: Any, check: Check, where: str, *, null: bool = True) -> None:
    if value is None and null:
        return
    if not check(value):
        raise ReportError(
            f"report field {where} is {_kind(value)}, expected {_NAMES[check]}" + (" or null" if null else "")
        )


def _each(mapping: Any, check: Check, where: str, *, null: bool = True) -> None:
    """Every value of an object (whose own type was checked) has the type ``check`` tests."""
    for key, value in mapping.items():
        _expect(value, check, f"{where}.{key}", null=null)


def _fields(obj: dict[str, Any], spec: dict[str, Check], where: str) -> None:
    for key, check in spec.items():
        if key in obj:
            _expect(obj[key], check, f"{where}.{key}")


_FINDING = {"id": _str, "severity": _str, "title": _str, "evidence": _object, "fix": _str, "detail": _str,
            "saving_ms": _number, "saving_per": _str}  # fmt: skip
#: The top-level fields servescope's own tools add (bench, the recorder, the doctor), each with
#: the type its readers rely on; their inner fields are checked below where a view reads them.
_EXTRA = {
    "throughput_rps": _number, "requests": _object, "uncorrected": _object, "server_timing": _object,
    "generator": _object, "replicas": _object, "generators": _list, "generators_lost": _list,
    "first_error": _str, "sweep": _list, "levels": _list, "folded_stage_names": _object,
    "verdict": _object, "evidence": _object, "not_checked": _object, "probes_disabled": _object,
    "endpoint_errors": _list, "endpoint_output": _list, "scaling_note": _str,
}  # fmt: skip


def check_types(data: dict[str, Any]) -> None:
    """Refuse (``ReportError``) a report whose documented fields have the wrong type."""
    _expect(data.get("created"), _str, "created")
    for key in ("environment", "meta", "errors"):
        _expect(data.get(key), _object, key)
    env = data.get("environment") or {}
    _expect(env.get("torch"), _object, "environment.torch")
    _each(data["latency"], _number, "latency")
    for name, stats in data["stages"].items():
        _expect(stats, _object, f"stages.{name}", null=False)
        _each(stats, _number, f"stages.{name}")
    _each(data.get("errors") or {}, _number, "errors", null=False)
    for i, finding in enumerate(data["findings"]):
        if isinstance(finding, dict):  # (not an object: Finding.from_dict says so)
            _fields(finding, _FINDING, f"findings[{i}]")
    for key, check in _EXTRA.items():
        _expect(data.get(key), check, key)
    _check_extras(data)


def _check_extras(data: dict[str, Any]) -> None:
    _each(data.get("replicas") or {}, _number, "replicas", null=False)
    for i, row in enumerate(data.get("generators") or []):
        _expect(row, _object, f"generators[{i}]", null=False)
        _expect(row.get("node"), _str, f"generators[{i}].node", null=False)
    for i, why in enumerate(data.get("generators_lost") or []):
        _expect(why, _str, f"generators_lost[{i}]", null=False)
    for i, line in enumerate(data.get("endpoint_output") or []):
        _expect(line, _str, f"endpoint_output[{i}]", null=False)
    _fields(data.get("server_timing") or {}, {"hint": _str, "responses_with_header": _number, "malformed": _number}, "server_timing")
    _fields(data.get("generator") or {}, {"behind": _bool, "schedule_lag_p50_ms": _number, "schedule_lag_p99_ms": _number}, "generator")
    _fields(data.get("folded_stage_names") or {}, {"limit": _number, "examples": _list, "into": _str}, "folded_stage_names")
    verdict = data.get("verdict") or {}
    _fields(verdict, {"diagnosed": _bool, "reason": _str, "failures": _object, "routes": _list, "hint": _str}, "verdict")
    for i, route in enumerate(verdict.get("routes") or []):
        _expect(route, _str, f"verdict.routes[{i}]", null=False)
