"""Which allocator serves a Configuration's devices, and the status that says so.

``decide`` chooses the scheduler (DRA) or the kubelets (device plugins) from what the
Configuration asks and what the API server keeps; ``status_patch`` and ``condition`` write the
choice to ``status.allocator`` (and ``status.sharedDeviceAllocation`` for agents of the previous
release), which every agent follows (docs/slots.md: one allocator per device)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from controller.state.records import format_time
from crds.api import API_VERSION
from crds.configuration import Allocator

CONDITION: Final = "Allocator"
#: Field manager of the two status fields written here (server-side apply keeps them apart from
#: the reconciler's and the agents' fields).
FIELD_MANAGER: Final = "edgeplug-controller/shared-allocation"

REASON_DRA: Final = "ServedByScheduler"
REASON_CHOSEN: Final = "DevicePluginChosen"
REASON_UNAVAILABLE: Final = "DRAExtendedResourcesUnavailable"
REASON_NO_API: Final = "ResourceAPIUnavailable"
REASON_CONTROLLER_WITHOUT_DRA: Final = "ControllerWithoutDRA"


@dataclass(frozen=True)
class Decision:
    mode: Allocator
    ok: bool
    reason: str
    message: str


#: Why the cluster cannot allocate shared devices through DRA: a reason and a message.
Missing = tuple[str, str]

#: What the API server lacks, as the controller's dry-run DeviceClass write finds it.
NO_EXTENDED_RESOURCES: Final[Missing] = (
    REASON_UNAVAILABLE, "the API server drops DeviceClass spec.extendedResourceName (feature "
    "gate DRAExtendedResource off)")
NO_RESOURCE_API: Final[Missing] = (
    REASON_NO_API, "the API server does not serve resource.k8s.io/v1 DeviceClasses")
#: A controller without ``--dra`` keeps no DeviceClasses, so nothing maps the resources.
CONTROLLER_WITHOUT_DRA: Final[Missing] = (
    REASON_CONTROLLER_WITHOUT_DRA, "the controller runs without --dra (no DeviceClasses)")


def decide(asked: Allocator | None, *, missing: Missing | None) -> Decision:
    """The allocator for a Configuration that ``asked`` for one (``None``: the cluster's best),
    given what the cluster lacks for DRA (``missing``: ``None`` when it serves everything)."""
    if asked == Allocator.DEVICE_PLUGIN:
        return Decision(Allocator.DEVICE_PLUGIN, True, REASON_CHOSEN,
                        "spec.allocator is devicePlugin: the kubelets allocate the devices "
                        "through the agents' device plugins (the compatibility mode)")
    if missing is None:
        return Decision(Allocator.DRA, True, REASON_DRA,
                        "the scheduler allocates the devices from ResourceSlices; pods ask "
                        "for them in resources.limits as before")
    reason, what = missing
    wanted = "spec.allocator is dra, but " if asked else ""
    return Decision(Allocator.DEVICE_PLUGIN, asked is None, reason,
                    f"{wanted}{what}: the kubelets allocate the devices through the agents' "
                    "device plugins meanwhile (the compatibility mode)")


def condition(decision: Decision, *, generation: int, current: Mapping[str, Any] | None,
              now: datetime) -> dict[str, Any]:
    """The ``Allocator`` condition, keeping ``lastTransitionTime`` while its
    status stays."""
    status = "True" if decision.ok else "False"
    previous = next((c for c in (current or {}).get("conditions") or []
                     if isinstance(c, Mapping) and c.get("type") == CONDITION), None)
    since = (str(previous.get("lastTransitionTime")) if previous is not None
             and previous.get("status") == status and previous.get("lastTransitionTime")
             else format_time(now))
    return {"type": CONDITION, "status": status, "reason": decision.reason,
            "message": decision.message, "lastTransitionTime": since,
            "observedGeneration": generation}


def mode_fields(decision: Decision) -> dict[str, str]:
    """The status fields that name the allocator: ``allocator``, and the same value under its
    earlier name ``sharedDeviceAllocation``, which agents of the previous release read."""
    return {"allocator": decision.mode.value, "sharedDeviceAllocation": decision.mode.value}


def status_patch(namespace: str, name: str, decision: Decision, *, generation: int,
                 current: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
    """The server-side apply body for ``configurations/status``: the mode and its condition."""
    return {
        "apiVersion": API_VERSION, "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "status": {**mode_fields(decision), "conditions": [
            condition(decision, generation=generation, current=current, now=now)]},
    }


def is_current(current: Mapping[str, Any] | None, decision: Decision) -> bool:
    """Whether ``current`` (a Configuration's status) already says ``decision``."""
    status = current or {}
    condition = next((c for c in status.get("conditions") or []
                      if isinstance(c, Mapping) and c.get("type") == CONDITION), None)
    return (all(status.get(name) == value for name, value in mode_fields(decision).items())
            and condition is not None
            and condition.get("status") == ("True" if decision.ok else "False")
            and condition.get("reason") == decision.reason
            and condition.get("message") == decision.message)


def put_mode(modes: dict[tuple[str, str], Allocator], configuration: tuple[str, str],
             mode: Allocator | None) -> bool:
    """Record ``configuration``'s allocator in ``modes`` (``None``: it is gone); whether that
    changed anything."""
    if modes.get(configuration) == mode:
        return False
    if mode is None:
        modes.pop(configuration, None)
    else:
        modes[configuration] = mode
    return True
