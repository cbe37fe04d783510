"""``metav1.LabelSelector``, parsed and evaluated against a Node's labels.

``LabelSelector.from_object`` and ``matches`` give a Configuration's ``nodeSelector`` the API
server's semantics (docs/architecture.md, "The API package").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True)
class LabelSelectorRequirement:
    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator is SelectorOperator.EXISTS:
            return present
        if self.operator is SelectorOperator.DOES_NOT_EXIST:
            return not present
        inside = present and labels[self.key] in self.values
        return inside if self.operator is SelectorOperator.IN else not inside

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LabelSelectorRequirement:
        return cls(
            key=str(obj["key"]),
            operator=SelectorOperator(obj["operator"]),
            values=tuple(str(v) for v in obj.get("values") or ()),
        )

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator.value}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a Node with ``labels`` is selected (all terms must hold; none selects all)."""
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        return all(req.matches(labels) for req in self.match_expressions)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LabelSelector:
        return cls(
            match_labels={str(k): str(v) for k, v in (obj.get("matchLabels") or {}).items()},
            match_expressions=tuple(
                LabelSelectorRequirement.from_object(e) for e in obj.get("matchExpressions") or ()
            ),
        )

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [e.to_object() for e in self.match_expressions]
        return out
