"""The report's JSON contract, checked on load: each field has the type docs/report-schema.md
gives it, or the report is refused with one ``ReportError`` that names the field.

    check_types(orjson.loads(text))      # raises ReportError("report field latency.p50_ms is ...")

A report may come from anywhere (``servescope report http://...``): everything the renderers
read is checked here once, so no view can fail half-way on a string where a number belongs.
Unknown fields are kept and not checked (new ones may appear within a schema version).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, get_args, get_origin, get_type_hints

from .exceptions import ReportError

__all__ = ["check_types", "check_v1_fields", "dump_section", "load_section", "load_value"]

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
            "saving_ms": _number, "saving_per": _str, "saving_basis": _str, "saving_low_ms": _number,
            "saving_high_ms": _number, "saving_coverage": _number, "saving_load": _str,
            "saving_share": _number}  # fmt: skip
#: The top-level fields servescope's own tools added in schema version 1 (bench, the recorder,
#: the doctor), each with the type its readers relied on; version 2 keeps them in typed sections
#: (sections/), checked by ``load_section``.
_V1_FIELDS = {
    "throughput_rps": _number, "requests": _object, "uncorrected": _object, "server_timing": _object,
    "generator": _object, "replicas": _object, "generators": _list, "generators_lost": _list,
    "first_error": _str, "sweep": _list, "levels": _list, "folded_stage_names": _object,
    "verdict": _object, "evidence": _object, "not_checked": _object, "probes_disabled": _object,
    "endpoint_errors": _list, "endpoint_output": _list, "scaling_note": _str,
}  # fmt: skip


def check_types(data: dict[str, Any]) -> None:
    """Refuse (``ReportError``) a report whose documented top-level fields have the wrong type
    (the sections are checked as they are built: ``load_section``)."""
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


def check_v1_fields(data: dict[str, Any]) -> None:
    """Refuse (``ReportError``) a version-1 report whose tools' top-level fields have the wrong
    type (before they are moved into their sections, so the message names the field as written)."""
    for key, check in _V1_FIELDS.items():
        _expect(data.get(key), check, key)
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


# -- typed sections ---------------------------------------------------------------------------
# A section of the report (sections/) is a dataclass; its JSON form is its fields. These
# two functions are the whole mapping, checked against the fields' type hints, so the dataclass
# is the one place a section's shape is written down.


def load_section(cls: type, data: Any, where: str) -> Any:
    """``cls`` (a dataclass with an ``unknown`` dict field) from its JSON object: each field
    checked against its type hint (``ReportError`` naming ``where.field``); absent fields take
    their defaults (an older writer); keys the class does not know go to ``unknown``, kept as
    they are (a newer writer)."""
    _expect(data, _object, where, null=False)
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        if f.name == "unknown":
            continue
        if f.name in data:
            kwargs[f.name] = _coerce(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _coerce(hints[f.name], None, f"{where}.{f.name}")
    kwargs["unknown"] = {k: v for k, v in data.items() if k not in names}
    return cls(**kwargs)


def load_value(hint: Any, value: Any, where: str) -> Any:
    """One value of a section's field from JSON, checked against the field's type hint."""
    return _coerce(hint, value, where)


def dump_section(obj: Any) -> Any:
    """The JSON form of a section (or of any value inside one): fields, then the keys kept."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: dump_section(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "unknown"}
        out.update(getattr(obj, "unknown", None) or {})
        return out
    if isinstance(obj, list):
        return [dump_section(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump_section(v) for k, v in obj.items()}
    return obj


_SCALARS: dict[Any, Check] = {float: _number, int: _number, str: _str, bool: _bool}


def _coerce(hint: Any, value: Any, where: str) -> Any:
    args = get_args(hint)
    nullable = isinstance(hint, types.UnionType) and type(None) in args
    if nullable:
        (hint,) = [a for a in args if a is not type(None)]
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if value is None and nullable:
            return None
        _expect(value, _object, where, null=nullable)
        return load_section(hint, value, where)
    origin = get_origin(hint)
    if origin is list:
        _expect(value, _list, where, null=nullable)
        if value is None:
            return None
        (item,) = get_args(hint)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _expect(value, _object, where, null=nullable)
        if value is None:
            return None
        item = get_args(hint)[1]
        return {k: _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
    _expect(value, _SCALARS[hint], where, null=nullable)
    return value
