"""Reading a handler's ``discoveryDetails``: YAML text to a mapping, and unknown fields refused.

``load_mapping`` and ``refuse_unknown`` are how every handler's ``parse_details`` starts, so every
handler refuses the same input the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from discovery_handlers.contract import InvalidDetails

ROOT = "(root)"


def load_mapping(
    details: str, *, field: str = ROOT, expected: str, empty_is_empty: bool = False
) -> dict[Any, Any]:
    """The details as a mapping. Anything else raises ``InvalidDetails(field, expected)``;
    empty details are ``{}`` where ``empty_is_empty`` (every field has a default), else the same
    error."""
    try:
        raw: Any = yaml.safe_load(details) if details.strip() else None
    except yaml.YAMLError as exc:
        raise InvalidDetails(ROOT, f"not valid YAML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # yaml's own guards against odd input
        raise InvalidDetails(ROOT, f"not valid YAML: {exc}") from None
    if raw is None and empty_is_empty:
        return {}
    if not isinstance(raw, dict):
        raise InvalidDetails(field, expected)
    return raw


def refuse_unknown(raw: dict[Any, Any], known: Iterable[str], *, prefix: str = "") -> None:
    """Raise ``InvalidDetails`` naming the first field of ``raw`` not in ``known``."""
    known_set = frozenset(known)
    unknown = sorted(set(map(str, raw)) - known_set)
    if unknown:
        raise InvalidDetails(prefix + unknown[0], f"unknown field (known: {sorted(known_set)})")
