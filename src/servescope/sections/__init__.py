"""The typed sections of a Report: what each tool adds beside the statistics.

    report.load.throughput_rps              # servescope bench
    report.diagnosis.verdict.diagnosed      # servescope doctor
    report.folded_stage_names.examples      # a Recorder that saw too many stage names

Each section is a small dataclass whose JSON form is its fields (docs/report-schema.md), under
its own key at the report's top level. A key a section does not know (a newer servescope wrote
it) is kept in ``unknown`` and written back, never dropped. Each section also says how
``Report.combine`` merges it: summed, joined, kept from the first report, or not merged at all
(then the combined report's ``meta["not_combined"]`` says what was left out, and why).

One module per tool that writes sections, over one base:

    base.py      Section (a JSON form, and how it combines), Notes, Summary
    load.py      servescope bench: Load and its parts (Requests, Stream, Tokens, Slo, Timeline, Http ...)
    sweep.py     a sweep of load levels: Sweep, SweepRow, FindMax
    doctor.py    servescope doctor: Diagnosis, Verdict, Unattributed
    recorder.py  a Recorder: FoldedStages, and Streaming (what servescope.serve streamed)

and here, every section by its key (``SECTIONS``) and ``Report.extra``'s version-1 view.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from ..schema import dump_section, load_value
from .base import Notes, Section, Summary  # noqa: F401 (first: load/telemetry.py imports Section from here while .load imports it)
from .doctor import Diagnosis, Unattributed, Verdict
from .load import (  # noqa: F401 (BURST_MS: importable from here as before)
    BURST_MS,
    GeneratorHealth,
    GeneratorRow,
    Http,
    Load,
    Requests,
    ServerTimingCounts,
    Sessions,
    SizeBucket,
    Slo,
    SloCheck,
    Stream,
    Timeline,
    Tokens,
    TurnRow,
    WarmupBacklog,
    Window,
)
from .recorder import FoldedStages, Streaming
from .sweep import FindMax, Sweep, SweepRow

__all__ = [
    "Diagnosis",
    "ExtraView",
    "FindMax",
    "FoldedStages",
    "GeneratorHealth",
    "GeneratorRow",
    "Http",
    "Load",
    "Requests",
    "SECTIONS",
    "Section",
    "Sessions",
    "ServerTimingCounts",
    "SizeBucket",
    "Slo",
    "SloCheck",
    "Stream",
    "Streaming",
    "Sweep",
    "SweepRow",
    "Timeline",
    "Tokens",
    "TurnRow",
    "Unattributed",
    "V1_FIELDS",
    "Verdict",
    "WarmupBacklog",
    "Window",
]


#: Every section, by its key at the report's top level (and the Report attribute of that name).
SECTIONS: dict[str, type[Section]] = {cls.key: cls for cls in (Load, Sweep, Diagnosis, FoldedStages, Streaming)}

#: Schema version 1 kept these fields at the top level: field -> (section key, its field there;
#: None for the whole section). ``Report.extra`` still answers to these names.
V1_FIELDS: dict[str, tuple[str, str | None]] = {
    **{f.name: ("load", f.name) for f in fields(Load) if f.name != "unknown"},
    "sweep": ("sweep", "rows"),
    "levels": ("sweep", "levels"),
    **{f.name: ("diagnosis", f.name) for f in fields(Diagnosis) if f.name != "unknown"},
    "folded_stage_names": ("folded_stage_names", None),
}


class ExtraView(MutableMapping[str, Any]):
    """``Report.extra``: the report's sections under their version-1 names (``throughput_rps``,
    ``verdict`` ...) as JSON values, and every other top-level key as it is.

    Kept so scripts written against ``report.extra[...]`` go on working; new code reads the
    typed sections (``report.load.throughput_rps``). A value read is a copy in JSON form (change
    the section, not it); a value set is checked and goes into its section. A field that is
    empty (None, [] or {}) reads as absent, as version 1 left such fields out."""

    def __init__(self, report: Any) -> None:
        self._report = report

    def __getitem__(self, key: str) -> Any:
        if key not in V1_FIELDS:
            return self._report.unknown[key]
        value = self._value(key)
        if value is None or value == [] or value == {}:
            raise KeyError(key)
        return dump_section(value)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in V1_FIELDS:
            self._report.unknown[key] = value
            return
        name, attr = V1_FIELDS[key]
        cls = SECTIONS[name]
        if attr is None:
            setattr(self._report, name, None if value is None else cls.from_dict(value, where=key))
            return
        section = getattr(self._report, name)
        if section is None:
            section = cls()
            setattr(self._report, name, section)
        setattr(section, attr, load_value(get_type_hints(cls)[attr], value, key))

    def __delitem__(self, key: str) -> None:
        if key not in V1_FIELDS:
            del self._report.unknown[key]
            return
        if key not in self:
            raise KeyError(key)
        name, attr = V1_FIELDS[key]
        if attr is None:
            setattr(self._report, name, None)
        else:
            f = next(f for f in fields(SECTIONS[name]) if f.name == attr)
            empty = f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]
            setattr(getattr(self._report, name), attr, empty)

    def __iter__(self) -> Iterator[str]:
        for key in V1_FIELDS:
            if key in self:
                yield key
        yield from list(self._report.unknown)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        if key not in V1_FIELDS:
            return key in self._report.unknown
        value = self._value(key)  # type: ignore[arg-type]
        return not (value is None or value == [] or value == {})

    def _value(self, key: str) -> Any:
        name, attr = V1_FIELDS[key]
        section = getattr(self._report, name)
        return section if attr is None or section is None else getattr(section, attr)

    def __repr__(self) -> str:
        return f"ExtraView({dict(self)!r})"
