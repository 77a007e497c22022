"""The sections a ``Recorder`` adds: the stage names it folded (``folded_stage_names``), and
what ``servescope.serve`` streamed (``streaming``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..stats import Distribution, summarize
from .base import Notes, Section, Summary

__all__ = ["FoldedStages", "Streaming"]


# -- the recorder -----------------------------------------------------------------------------
@dataclass(kw_only=True)
class FoldedStages(Section):
    """More stage names of the user's own than ``limit`` were seen: those past it (the first
    few in ``examples``) were counted together, one sample per request, under ``into``.

    Combined: the examples joined (first seen first), the smallest limit, ``into`` kept."""

    key: ClassVar[str] = "folded_stage_names"

    limit: int = 0
    examples: list[str] = field(default_factory=list)
    into: str = "(more stages)"

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> FoldedStages | None:
        have: list[FoldedStages] = [p for p in parts if p is not None]
        if not have:
            return None
        examples = list(dict.fromkeys(name for p in have for name in p.examples))
        return FoldedStages(limit=min(p.limit for p in have), examples=examples, into=have[0].into)


# -- servescope.serve ------------------------------------------------------------------------
@dataclass(kw_only=True)
class Streaming(Section):
    """What ``servescope.serve`` streamed, as the server saw it: ``first_chunk`` from a request's
    arrival to its first chunk handed to the server, ``chunk_gap`` between its consecutive
    chunks (all responses' gaps together). The client's view, network included, is
    ``load.stream`` of ``servescope bench``. Combined by merging ``distributions``."""

    key: ClassVar[str] = "streaming"

    responses: int = 0
    chunks: int = 0
    first_chunk: Summary | None = None
    chunk_gap: Summary | None = None
    distributions: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_distributions(cls, first: Distribution, gaps: Distribution, *, chunks: int) -> Streaming:
        return cls(
            responses=len(first), chunks=chunks, first_chunk=summarize(first), chunk_gap=summarize(gaps) if len(gaps) else None,
            distributions={"first_chunk": first.to_dict(), "chunk_gap": gaps.to_dict()},
        )  # fmt: skip

    def distribution(self, name: str) -> Distribution:
        """``first_chunk`` or ``chunk_gap`` (empty when the section has none)."""
        data = self.distributions.get(name)
        return Distribution() if data is None else Distribution.from_dict(data, where=f"streaming.distributions.{name}")

    @classmethod
    def combine(cls, parts: list[Any], notes: Notes) -> Streaming | None:
        have: list[Streaming] = [p for p in parts if p is not None]
        if not have:
            return None
        first, gaps = have[0].distribution("first_chunk"), have[0].distribution("chunk_gap")
        for p in have[1:]:
            first, gaps = first.merge(p.distribution("first_chunk")), gaps.merge(p.distribution("chunk_gap"))
        return cls.from_distributions(first, gaps, chunks=sum(p.chunks for p in have))
