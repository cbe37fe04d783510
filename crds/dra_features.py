"""Which DRA features the API server serves, read from what it stored of our own writes.

``dropped_by_device_class`` and ``dropped_by_slice`` compare a body sent with the object stored;
``FeatureReport`` logs each dropped feature once per process. Why: docs/architecture.md, "The API
package", and docs/versions.md.
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
PARTITIONABLE_DEVICES: Final = "DRAPartitionableDevices"
CONSEQUENCES: Final[Mapping[str, str]] = {
    EXTENDED_RESOURCE: "pods asking for an edgeplug.io/ extended resource are served by device "
                       "plugins only, never from ResourceSlices",
    CONSUMABLE_CAPACITY: "a shared device's slice offers it to one claim at a time (no 'slots' "
                         "capacity)",
    DEVICE_TAINTS: "an unhealthy device is left out of its slice instead of tainted",
    PARTITIONABLE_DEVICES: "partitions of a device (sharedCounters, consumesCounters) cannot be "
                           "offered to the scheduler: they are withdrawn rather than "
                           "published without the counters that keep them from overlapping",
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
        if device.get("consumesCounters") and not kept.get("consumesCounters"):
            dropped.add(PARTITIONABLE_DEVICES)
    if ((sent.get("spec") or {}).get("sharedCounters")
            and not (stored.get("spec") or {}).get("sharedCounters")):
        dropped.add(PARTITIONABLE_DEVICES)
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
