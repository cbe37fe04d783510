"""Which DRA features the API server serves, read from what it stored of our own writes.

Why this exists: edgeplug runs on every Kubernetes minor upstream supports, and DRA's newer
fields (a DeviceClass's ``extendedResourceName``, a device's consumable capacity and
``allowMultipleAllocations``, device taints) exist in the API of every such minor but are kept
only where their feature gate is on: elsewhere the API server drops them on write without an
error. A version string would say nothing about a cluster whose admin turned a gate on or off,
so the agent and the controller compare each body they apply with the object the API server
returns and report, once per process and feature, the field it dropped and what that costs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: The feature gate behind each field edgeplug writes, and what a cluster without it loses.
EXTENDED_RESOURCE: Final = "DRAExtendedResource"
CONSUMABLE_CAPACITY: Final = "DRAConsumableCapacity"
DEVICE_TAINTS: Final = "DRADeviceTaints"
CONSEQUENCES: Final[Mapping[str, str]] = {
    EXTENDED_RESOURCE: "pods asking for an edgeplug.io/ extended resource are served by device "
                       "plugins only, never from ResourceSlices",
    CONSUMABLE_CAPACITY: "a shared device's slice offers it to one claim at a time (no 'slots' "
                         "capacity)",
    DEVICE_TAINTS: "an unhealthy device is left out of its slice instead of tainted",
}


def dropped_by_device_class(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The features whose DeviceClass fields ``sent`` carried and ``stored`` lacks."""
    if (sent.get("spec") or {}).get("extendedResourceName") and not (
            (stored.get("spec") or {}).get("extendedResourceName")):
        return [EXTENDED_RESOURCE]
    return []


def dropped_by_slice(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The features whose ResourceSlice device fields ``sent`` carried and ``stored`` lacks
    (devices are compared by name)."""
    stored_devices = {d.get("name"): d for d in (stored.get("spec") or {}).get("devices") or []}
    dropped: set[str] = set()
    for device in (sent.get("spec") or {}).get("devices") or []:
        kept = stored_devices.get(device.get("name")) or {}
        if device.get("allowMultipleAllocations") and not kept.get("allowMultipleAllocations"):
            dropped.add(CONSUMABLE_CAPACITY)
        if device.get("taints") and not kept.get("taints"):
            dropped.add(DEVICE_TAINTS)
    return sorted(dropped)


@dataclass
class FeatureReport:
    """Logs each missing feature once per process (a WARNING naming the field's gate and its
    cost) and remembers it, so a status or a metric can say so too."""

    logger: logging.Logger
    missing: set[str] = field(default_factory=set)

    def note(self, features: Iterable[str], *, what: str) -> None:
        """Record ``features`` found missing while writing ``what`` (an object's kind/name)."""
        for feature in features:
            if feature in self.missing:
                continue
            self.missing.add(feature)
            self.logger.warning(
                "the API server does not serve %s (it dropped the field from %s): %s",
                feature, what, CONSEQUENCES[feature])
