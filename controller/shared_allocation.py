"""Which allocator serves a Configuration's shared devices, and the status that says so.

Why this exists: a shared device (seen by several nodes) must have exactly one allocator. The
scheduler is one (DRA: a ResourceSlice per device with a consumable ``slots`` capacity, and a
DeviceClass mapping ``edgeplug.io/<name>`` so unchanged pods are served from it); the agents'
device plugins with their cross-node slot protocol are the other, kept for clusters whose API
server does not serve extended-resource mapping and for Configurations that ask for it
(``spec.sharedDeviceAllocation: devicePlugin``). The controller decides, because it writes the
DeviceClasses and so is the one that sees whether the API server keeps
``extendedResourceName``; it writes the choice to ``status.sharedDeviceAllocation`` with the
``SharedDeviceAllocation`` condition, and every agent follows it (docs/slots.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from controller.status import format_time
from crds.api import API_VERSION
from crds.configuration import SharedDeviceAllocation

CONDITION: Final = "SharedDeviceAllocation"
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
    mode: SharedDeviceAllocation
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


def decide(asked: SharedDeviceAllocation | None, *, missing: Missing | None) -> Decision:
    """The allocator for a Configuration that ``asked`` for one (``None``: the cluster's best),
    given what the cluster lacks for DRA (``missing``: ``None`` when it serves everything)."""
    if asked == SharedDeviceAllocation.DEVICE_PLUGIN:
        return Decision(SharedDeviceAllocation.DEVICE_PLUGIN, True, REASON_CHOSEN,
                        "spec.sharedDeviceAllocation is devicePlugin: the agents' device plugins "
                        "allocate shared devices (the compatibility mode)")
    if missing is None:
        return Decision(SharedDeviceAllocation.DRA, True, REASON_DRA,
                        "the scheduler allocates shared devices from ResourceSlices; pods ask "
                        "for them in resources.limits as before")
    reason, what = missing
    wanted = "spec.sharedDeviceAllocation is dra, but " if asked else ""
    return Decision(SharedDeviceAllocation.DEVICE_PLUGIN, asked is None, reason,
                    f"{wanted}{what}: the agents' device plugins allocate shared devices "
                    "meanwhile (the compatibility mode)")


def condition(decision: Decision, *, generation: int, current: Mapping[str, Any] | None,
              now: datetime) -> dict[str, Any]:
    """The ``SharedDeviceAllocation`` condition, keeping ``lastTransitionTime`` while its
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


def status_patch(namespace: str, name: str, decision: Decision, *, generation: int,
                 current: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
    """The server-side apply body for ``configurations/status``: the mode and its condition."""
    return {
        "apiVersion": API_VERSION, "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"sharedDeviceAllocation": decision.mode.value, "conditions": [
            condition(decision, generation=generation, current=current, now=now)]},
    }


def is_current(current: Mapping[str, Any] | None, decision: Decision) -> bool:
    """Whether ``current`` (a Configuration's status) already says ``decision``."""
    status = current or {}
    condition = next((c for c in status.get("conditions") or []
                      if isinstance(c, Mapping) and c.get("type") == CONDITION), None)
    return (status.get("sharedDeviceAllocation") == decision.mode.value
            and condition is not None
            and condition.get("status") == ("True" if decision.ok else "False")
            and condition.get("reason") == decision.reason
            and condition.get("message") == decision.message)


def put_mode(modes: dict[tuple[str, str], SharedDeviceAllocation], configuration: tuple[str, str],
             mode: SharedDeviceAllocation | None) -> bool:
    """Record ``configuration``'s allocator in ``modes`` (``None``: it is gone); whether that
    changed anything."""
    if modes.get(configuration) == mode:
        return False
    if mode is None:
        modes.pop(configuration, None)
    else:
        modes[configuration] = mode
    return True
