"""Which node a Pending pod is pinned to, what it asks for, and the demand record on a Node.

``pinned_node``, ``extended_requests``, ``sum_requests`` and the ``PINNED_DEMAND_ANNOTATION``
format; the controller and the agent judge pods by these same functions (docs/slots.md, C5).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
NAME_FIELD: Final = "metadata.name"
#: On a Node: JSON ``{"<extended resource>": <count>}`` of what Pending pods pinned to that node
#: request, unscheduled or bound and not yet started (written by the controller; absent when
#: nothing is pinned there). The node's agent subtracts the pinned pods it already sees bound.
PINNED_DEMAND_ANNOTATION: Final = "edgeplug.io/pinned-demand"

Requests = dict[str, int]


def _pins(requirement: Mapping[str, Any], key: str) -> str | None:
    values = requirement.get("values") or []
    if requirement.get("key") == key and requirement.get("operator") == "In" and len(
        set(values)
    ) == 1:
        return str(values[0])
    return None


def _term_node(term: Mapping[str, Any]) -> str | None:
    """The one node a node-selector term admits, if it pins one."""
    pinned = {_pins(r, NAME_FIELD) for r in term.get("matchFields") or []}
    pinned |= {_pins(r, HOSTNAME_LABEL) for r in term.get("matchExpressions") or []}
    pinned.discard(None)
    return pinned.pop() if len(pinned) == 1 else None


def pinned_node(spec: Mapping[str, Any]) -> str | None:
    """The node a pod (its ``spec``, as the API gives it) can only run on; None if unpinned."""
    by_selector = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if by_selector:
        return str(by_selector)
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return None
    # Terms are ORed: the pod is pinned only if every term admits the same single node.
    nodes = {_term_node(term) for term in terms}
    return nodes.pop() if len(nodes) == 1 and None not in nodes else None


def _container_requests(container: Mapping[str, Any]) -> Requests:
    resources = container.get("resources") or {}
    # Extended resources must have requests == limits; either one may be given alone.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    counts: Requests = {}
    for name, quantity in merged.items():
        if "/" in name and str(quantity).isdecimal() and int(str(quantity)) > 0:
            counts[name] = int(str(quantity))
    return counts


def extended_requests(spec: Mapping[str, Any]) -> Requests:
    """Extended resources (``<domain>/<name>``) the pod needs: the sum over its containers, or
    more if one init container alone asks for more (init containers run one at a time)."""
    total: Requests = {}
    for container in spec.get("containers") or []:
        for name, count in _container_requests(container).items():
            total[name] = total.get(name, 0) + count
    for init in spec.get("initContainers") or []:
        for name, count in _container_requests(init).items():
            total[name] = max(total.get(name, 0), count)
    return total


def sum_requests(pods: Iterable[Mapping[str, int]]) -> Requests:
    total: Requests = {}
    for requests in pods:
        for name, count in requests.items():
            total[name] = total.get(name, 0) + count
    return total


def format_pinned_demand(requests: Mapping[str, int]) -> str:
    """The annotation's value (stable: equal demand, equal text, so no needless writes)."""
    return json.dumps({k: v for k, v in sorted(requests.items()) if v > 0},
                      separators=(",", ":"))


def parse_pinned_demand(value: str | None) -> Requests:
    """The annotation's counts; a missing or malformed value is no demand (ValueError names
    what is wrong, for the caller to log)."""
    if not value:
        return {}
    try:
        data = json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"{PINNED_DEMAND_ANNOTATION} is not JSON: {error}") from error
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in data.items()
    ):
        raise ValueError(f"{PINNED_DEMAND_ANNOTATION} must map resource names to counts >= 0")
    return {k: v for k, v in data.items() if v > 0}
