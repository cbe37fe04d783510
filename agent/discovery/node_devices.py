"""What this node can serve right now: the in-process hand-off from discovery to device plugins.

An Instance in the API server carries a device's properties, but not the
node-specific parts a kubelet needs at ``Allocate`` time (host mounts, device nodes, the
handler's hooks), and a shared Instance lists many nodes. Discovery runs put what *this* node
sees here, as one record that holds the handler's ``Device`` itself, so a field added to the
handler contract reaches ``Allocate`` without being copied field by field; the device plugins
read it. The table is versioned so a reader can wait for the next change instead of polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crds.configuration import Allocator
from discovery_handlers.contract import (
    HEALTHY,
    Device,
    DiscoveryHandler,
    Health,
    PreparingHandler,
)


@dataclass(frozen=True)
class NodeDevice:
    """One Instance as this node serves it: the handler's device and what the agent adds.

    ``health`` is the device's own, or the agent's verdict (a shared device not seen any more
    stays, unhealthy, for its grace period). ``shared``: the Instance is the shared one of
    several nodes, not this node's own. ``cdi_name`` is set only once a CDI spec naming
    the device is on disk. ``handler`` and ``details`` serve the hooks (compose, rank,
    prepare); records compare equal when nothing a plugin uses changed, so re-publishing an
    unchanged list wakes nobody. ``configuration_resource`` is the Configuration's own extended
    resource (``edgeplug.io/<configuration>`` or its ``spec.resourceName``), as the discovery
    side read it, so the slot service need not read the Configuration again; "" when unknown.
    """

    instance: str
    namespace: str
    configuration: str
    device: Device
    broker_properties: Mapping[str, str] = field(default_factory=dict)
    cdi_name: str = ""
    configuration_resource: str = ""
    health: Health = HEALTHY
    shared: bool = False
    handler: DiscoveryHandler | None = None
    details: Any = None

    @property
    def properties(self) -> dict[str, str]:
        """The device's properties with the Configuration's ``brokerProperties`` on top."""
        return {**self.device.properties, **self.broker_properties}

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    @property
    def needs_prepare(self) -> bool:
        return _prepares(self.handler)


#: Handler class → whether it is a ``PreparingHandler``. ``isinstance`` against a runtime-checkable
#: Protocol walks the Protocol's members on every call; every reconcile pass asks this of every
#: served device twice. No handler gains or loses ``prepare`` after it is made, so the answer
#: for the first handler of a class holds for the class.
_PREPARING: dict[type, bool] = {}


def _prepares(handler: DiscoveryHandler | None) -> bool:
    known = _PREPARING.get(type(handler))
    if known is None:
        known = _PREPARING[type(handler)] = isinstance(handler, PreparingHandler)
    return known


class NodeDeviceTable:
    """A versioned map of (namespace, instance name) to ``NodeDevice``."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, str], NodeDevice] = {}
        #: (namespace, configuration) → the allocator of its devices, as the Configuration
        #: says (``crds.configuration.allocator_of``).
        self._allocators: dict[tuple[str, str], Allocator] = {}
        #: Configurations whose allocator a controller of the previous release chose, for
        #: their shared devices only (``crds.configuration.decided_for_shared_devices_only``).
        self._shared_only: set[tuple[str, str]] = set()
        #: (namespace, configuration) → how many of its devices here are shared.
        self._shared_devices: dict[tuple[str, str], int] = {}
        self._graces: dict[tuple[str, str], int] = {}
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def version(self) -> int:
        return self._version

    def get(self, namespace: str, instance: str) -> NodeDevice | None:
        return self._devices.get((namespace, instance))

    def snapshot(self) -> dict[tuple[str, str], NodeDevice]:
        return dict(self._devices)

    def allocator(self, namespace: str, configuration: str) -> Allocator | None:
        """Who allocates the Configuration's devices, as the Configuration (its spec, or the
        controller in its status) says; ``None`` while it does not say. Where a controller of
        the previous release said it, for shared devices only, a Configuration with no shared
        device here keeps its local devices on the device plugins: that controller maps their
        resources to no DeviceClass, so the scheduler could serve no pod asking for them by
        name."""
        key = (namespace, configuration)
        chosen = self._allocators.get(key)
        if chosen is not None and key in self._shared_only and not self._shared_devices.get(key):
            return Allocator.DEVICE_PLUGIN
        return chosen

    def device_plugins_allocate(self, namespace: str, configuration: str, *, dra: bool) -> bool:
        """Whether the kubelets' device plugins allocate the Configuration's devices on this
        node: it says so, or it says nothing yet and the agent serves no DRA."""
        allocator = self.allocator(namespace, configuration)
        return allocator == Allocator.DEVICE_PLUGIN or (allocator is None and not dra)

    def decided_by_previous_controller(self, namespace: str, configuration: str) -> bool:
        """Whether a controller of the previous release chose the Configuration's allocator
        (it offers a shared device on a node only once that node's ``status.reported`` mark
        is written)."""
        return (namespace, configuration) in self._shared_only

    async def set_allocator(self, namespace: str, configuration: str,
                            allocator: Allocator | None, *, shared_only: bool = False) -> None:
        """Record the Configuration's allocator (``None``: undecided, or it is gone);
        ``shared_only``: a previous release's controller chose it for shared devices only."""
        key = (namespace, configuration)
        if self._allocators.get(key) == allocator and (key in self._shared_only) == shared_only:
            return
        if shared_only:
            self._shared_only.add(key)
        else:
            self._shared_only.discard(key)
        if allocator is None:
            self._allocators.pop(key, None)
        else:
            self._allocators[key] = allocator
        await self._bump()

    def eviction_grace(self, namespace: str, configuration: str) -> int | None:
        """Seconds the Configuration lets a device stay unhealthy before its pods are evicted
        (``spec.unhealthyDevices.evictAfterSeconds``); None: they stay."""
        return self._graces.get((namespace, configuration))

    async def set_eviction_grace(self, namespace: str, configuration: str,
                                 grace: int | None) -> None:
        """Record the Configuration's eviction grace (``None``: none, or it is gone)."""
        key = (namespace, configuration)
        if self._graces.get(key) == grace:
            return
        if grace is None:
            self._graces.pop(key, None)
        else:
            self._graces[key] = grace
        await self._bump()

    async def put(self, device: NodeDevice) -> None:
        key = (device.namespace, device.instance)
        old = self._devices.get(key)
        if old != device:
            self._count_shared(old, -1)
            self._devices[key] = device
            self._count_shared(device, 1)
            await self._bump()

    async def remove(self, namespace: str, instance: str) -> None:
        old = self._devices.pop((namespace, instance), None)
        if old is not None:
            self._count_shared(old, -1)
            await self._bump()

    def _count_shared(self, device: NodeDevice | None, step: int) -> None:
        if device is not None and device.shared:
            key = (device.namespace, device.configuration)
            count = self._shared_devices.get(key, 0) + step
            if count:
                self._shared_devices[key] = count
            else:
                self._shared_devices.pop(key, None)

    async def wait_changed(self, since: int) -> int:
        """Return once the version differs from ``since``; returns the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != since)
            return self._version

    async def _bump(self) -> None:
        async with self._changed:
            self._version += 1
            self._changed.notify_all()
