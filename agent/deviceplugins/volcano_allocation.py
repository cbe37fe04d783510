"""Allocate honours the chips Volcano chose for the pod being admitted (Huawei's "volcano mode").

``VolcanoPins`` finds, among the pods bound here that wait for their chips, the one with the
oldest ``predicate-time`` asking as many chips as the request, and answers
``ConfigurationBackend`` with the Instances of the chips it names (``Pin``); the backend claims
their slots or refuses, naming the chips and why. A pod is served once (remembered here, and
skipped once it holds devices in pod-resources). docs/handlers/ascend.md, "Allocate gives the
chips Volcano chose".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.deviceplugins.slots.bound_pods import pods_bound_here
from agent.discovery.node_devices import NodeDevice
from agent.kube.node_reads import NodeReads
from discovery_handlers.ascend.devices import EXTRA_PHY, PROP_FAMILY

log = logging.getLogger(__name__)

PREDICATE_TIME = "predicate-time"
#: Huawei's value for "this pod has its chips" (the largest unsigned 64-bit value).
SERVED = str(2**64 - 1)
#: Pods remembered as served, at most (the oldest forgotten first).
SERVED_KEPT = 4096


@dataclass(frozen=True)
class Pin:
    """Instances a scheduler chose for one container's request, one per requested id."""

    instances: tuple[str, ...]
    #: Who chose them, for messages: "Volcano's choice for pod ns/name (Ascend910-2)".
    owner: str
    #: The chip names, by Instance, for messages.
    names: Mapping[str, str]
    pod: tuple[str, str, str]  # namespace, name, uid


class PinRefused(Exception):
    """The scheduler's choice cannot be honoured (a chip it named is not on this node)."""


class VolcanoPins:
    """``ConfigurationBackend``'s pin source for one Configuration's Ascend chips."""

    def __init__(self, *, reads: NodeReads, node: str,
                 devices: Callable[[], Sequence[tuple[str, NodeDevice]]],
                 holding: Callable[[], Awaitable[set[tuple[str, str]]]] | None) -> None:
        """``devices()``: the Configuration's Instances on this node and their records;
        ``holding()``: the pods the kubelet's pod-resources lists as holding devices."""
        self._reads = reads
        self._node = node
        self._devices = devices
        self._holding = holding
        self._served: dict[str, None] = {}

    def _chips(self) -> tuple[str, dict[str, str]] | None:
        """The family and chip name → Instance, when these are Huawei-style Ascend chips."""
        family = ""
        chips: dict[str, str] = {}
        for instance, record in self._devices():
            handler, details = record.handler, record.details
            if getattr(handler, "name", "") != "ascend" or not getattr(
                    details, "huawei_metadata", False):
                return None
            family = family or record.device.properties.get(PROP_FAMILY, "")
            phy = record.device.extra.get(EXTRA_PHY)
            if phy is not None:
                chips[f"{family}-{phy}"] = instance
        return (family, chips) if family and chips else None

    async def __call__(self, size: int) -> Pin | None:
        """The Instances Volcano chose for a request of ``size`` chips (None: no Volcano pod
        waits for that many here, so the kubelet's choice stands). Raises ``PinRefused``."""
        found = self._chips()
        if found is None:
            return None
        family, chips = found
        key = f"huawei.com/{family}"
        pods = await pods_bound_here(await self._reads.client(), self._node)
        holding = await self._holding() if self._holding else set()
        waiting = [p for p in pods if _waits(p, key, size)
                   and p["metadata"].get("uid") not in self._served
                   and (p["metadata"]["namespace"], p["metadata"]["name"]) not in holding]
        if not waiting:
            return None
        pod = min(waiting, key=lambda p: int(p["metadata"]["annotations"][PREDICATE_TIME]))
        meta = pod["metadata"]
        value = meta["annotations"][key]
        names = [name.strip() for name in value.split(",")]
        owner = f"Volcano's choice for pod {meta['namespace']}/{meta['name']} ({value})"
        missing = [name for name in names if name not in chips]
        if missing:
            raise PinRefused(f"{owner}: {', '.join(missing)} not on this node (it has "
                             f"{', '.join(sorted(chips)) or 'none'})")
        instances = tuple(chips[name] for name in names)
        return Pin(instances=instances, owner=owner,
                   names={chips[name]: name for name in names},
                   pod=(meta["namespace"], meta["name"], meta.get("uid", "")))

    def served(self, pin: Pin) -> None:
        """The pin's allocation holds: its pod is not chosen again."""
        self._served[pin.pod[2]] = None
        while len(self._served) > SERVED_KEPT:
            del self._served[next(iter(self._served))]
        log.info("allocated the chips Volcano chose", extra={
            "pod": f"{pin.pod[0]}/{pin.pod[1]}", "chips": ",".join(pin.names.values())})


def _waits(pod: Mapping[str, Any], key: str, size: int) -> bool:
    """A pod Volcano placed here that still waits for its chips, asking for ``size``."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    stamp = annotations.get(PREDICATE_TIME, "")
    if key not in annotations or not stamp.isdigit() or stamp == SERVED:
        return False
    if (pod.get("status") or {}).get("phase") != "Pending":
        return False
    return len([n for n in annotations[key].split(",") if n.strip()]) == size
