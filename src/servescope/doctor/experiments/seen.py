"""What the probes saw that an experiment acts on: the live objects the endpoint called.
Never saved with a report (the report keeps only the evidence)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Seen"]


@dataclass
class Seen:
    torch: Any = None
    #: the outermost torch modules the requests called (alive at the end of the run)
    modules: list[Any] = field(default_factory=list)
    #: input fingerprint -> (the object a model call went to, its method, how its inputs are read)
    owners: dict[str, tuple[Any, str, Callable[[tuple[Any, ...], dict[str, Any]], Any]]] = field(default_factory=dict)
    #: fingerprints of the calls whose inputs never changed with the request
    constant: frozenset[str] = frozenset()
    #: model classes the requests built
    model_types: list[type] = field(default_factory=list)
    #: keys of loader calls that read the request's own data (never answered from memory)
    data_keys: frozenset[int] = frozenset()

    @classmethod
    def from_probes(cls, probes: Any, constant: frozenset[str], data_keys: frozenset[int] = frozenset()) -> Seen:
        owners = {}
        for fp, (ref, method, inputs_of) in list(probes.owners.items()):
            obj = ref()
            if obj is not None:
                owners[fp] = (obj, method, inputs_of)
        return cls(
            torch=probes.torch,
            modules=list(probes.modules.values()),
            owners=owners,
            constant=constant,
            model_types=list(probes.model_types),
            data_keys=data_keys,
        )
