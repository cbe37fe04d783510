"""Computes the part of a Configuration's status the controller owns. Pure.

``desired_status`` builds it and ``needs_write`` says whether it differs from what is stored
(docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from controller.state.records import format_time

CONDITION_BROKER_SPEC_VALID: Final = "BrokerSpecValid"
CONDITION_BROKERS_READY: Final = "BrokersReady"
CONDITION_BROKER_NODES_SELECTED: Final = "BrokerNodesSelected"
OWNED_CONDITIONS: Final = (CONDITION_BROKER_SPEC_VALID, CONDITION_BROKERS_READY,
                           CONDITION_BROKER_NODES_SELECTED)

REASON_VALID: Final = "Valid"
REASON_NO_BROKER_SPEC: Final = "NoBrokerSpec"
REASON_INVALID: Final = "InvalidBrokerSpec"
REASON_REFUSED: Final = "BrokerCreationRefused"
REASON_ALL_READY: Final = "AllBrokersReady"
REASON_NO_BROKERS: Final = "NoBrokers"
REASON_NOT_READY: Final = "BrokersNotReady"
REASON_NODE_NOT_SELECTED: Final = "NodeNotSelected"
MESSAGE_MAX: Final = 1024


@dataclass(frozen=True, kw_only=True)
class BrokerCounts:
    instances: int
    desired: int
    ready: int


def _by_type(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    conditions = (status or {}).get("conditions") or []
    return {str(c.get("type")): c for c in conditions if isinstance(c, Mapping)}


def _condition(
    *,
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    status = "True" if ok else "False"
    if previous is not None and previous.get("status") == status:
        since = str(previous.get("lastTransitionTime") or format_time(now))
    else:
        since = format_time(now)
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def desired_status(
    *,
    generation: int,
    counts: BrokerCounts,
    has_broker_spec: bool,
    spec_problems: Sequence[str],
    refusal: str | None,
    current: Mapping[str, Any] | None,
    now: datetime,
    unselected: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The controller's fields of ``status``, ready for a server-side apply. ``unselected``:
    Instance → the nodes of its ``spec.nodes`` the nodeSelector does not select."""
    previous = _by_type(current)
    if not has_broker_spec:
        spec_ok, spec_reason = True, REASON_NO_BROKER_SPEC
        spec_message = "no broker spec: brokers are not created"
    elif spec_problems:
        spec_ok, spec_reason, spec_message = False, REASON_INVALID, "; ".join(spec_problems)
    elif refusal:
        spec_ok, spec_reason, spec_message = False, REASON_REFUSED, refusal
    else:
        spec_ok, spec_reason, spec_message = True, REASON_VALID, "the broker spec is valid"
    if counts.desired == 0:
        ready_ok, ready_reason = True, REASON_NO_BROKERS
        ready_message = "no broker is wanted"
    else:
        ready_ok = counts.ready >= counts.desired
        ready_reason = REASON_ALL_READY if ready_ok else REASON_NOT_READY
        ready_message = f"{counts.ready}/{counts.desired} brokers ready"
    conditions = [
        _condition(
            kind=CONDITION_BROKER_SPEC_VALID,
            ok=spec_ok,
            reason=spec_reason,
            message=spec_message,
            generation=generation,
            previous=previous.get(CONDITION_BROKER_SPEC_VALID),
            now=now,
        ),
        _condition(
            kind=CONDITION_BROKERS_READY,
            ok=ready_ok,
            reason=ready_reason,
            message=ready_message,
            generation=generation,
            previous=previous.get(CONDITION_BROKERS_READY),
            now=now,
        ),
    ]
    if unselected:
        listed = "; ".join(f"Instance {name} lists {', '.join(nodes)}"
                           for name, nodes in sorted(unselected.items()))
        conditions.append(_condition(
            kind=CONDITION_BROKER_NODES_SELECTED, ok=False, reason=REASON_NODE_NOT_SELECTED,
            message=f"no broker on nodes the nodeSelector does not select: {listed}",
            generation=generation, previous=previous.get(CONDITION_BROKER_NODES_SELECTED),
            now=now))
    return {
        "observedGeneration": generation,
        "instanceCount": counts.instances,
        "brokers": {"desired": counts.desired, "ready": counts.ready},
        "conditions": conditions,
    }


def needs_write(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether ``current`` differs from ``desired`` in any field the controller owns."""
    current = current or {}
    for key in ("observedGeneration", "instanceCount", "brokers"):
        if current.get(key) != desired.get(key):
            return True
    if any(name in desired and current.get(name) != desired[name]
           for name in ("allocator", "sharedDeviceAllocation")):
        return True  # written here only without --dra (controller.dra.shared_allocation)
    have = _by_type(current)
    wanted = {str(c["type"]) for c in desired.get("conditions") or []}
    if any(kind in have and kind not in wanted for kind in OWNED_CONDITIONS):
        return True  # one of ours to withdraw (the apply leaves it out)
    for condition in desired.get("conditions") or []:
        existing = have.get(condition["type"])
        if existing is None:
            return True
        for key in ("status", "reason", "message", "observedGeneration"):
            if existing.get(key) != condition.get(key):
                return True
    return False
