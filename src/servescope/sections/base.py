"""The base of every report section: ``Section`` (a dataclass with a JSON form, and how
``Report.combine`` merges it), and the types the sections share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..schema import dump_section, load_section

__all__ = ["Notes", "Section", "Summary"]

Notes = dict[str, str]


@dataclass(kw_only=True)
class Section:
    """A part of the report with a JSON form; ``unknown`` keeps the keys this version does not know."""

    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return dump_section(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "") -> Any:
        """From the JSON form; a value of the wrong type is a ``ReportError`` naming ``where.field``."""
        return load_section(cls, data, where or cls.key)

    #: the section's key at the report's top level
    key: ClassVar[str] = ""

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Any:
        """One section from the reports' (``None`` where a report has none); what cannot be
        merged is left out and said in ``notes`` (field -> why). Default: not mergeable."""
        if any(p is not None for p in parts):
            notes[cls.key] = cls.not_mergeable
        return None

    not_mergeable: ClassVar[str] = "describes one run and cannot be merged"


Summary = dict[str, float | None]
