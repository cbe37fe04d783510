"""What this node can serve right now: the in-process hand-off from discovery to device plugins.

Why this exists: an Instance in the API server carries a device's properties, but not the
node-specific parts a kubelet needs at ``Allocate`` time (host mounts, device nodes, a prepare
step), and a shared Instance lists many nodes. Discovery runs put what *this* node sees here;
the device plugins read it. It is versioned so a reader can wait for the next change instead of
polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from discovery_handlers.contract import DeviceSpec, Mount


@dataclass(frozen=True)
class NodeDevice:
    """One Instance as this node serves it."""

    instance: str
    namespace: str
    configuration: str
    properties: Mapping[str, str]  # device properties merged with the brokerProperties
    mounts: tuple[Mount, ...]
    device_specs: tuple[DeviceSpec, ...]
    cdi_name: str
    healthy: bool = True
    prepare: Callable[[], Awaitable[None]] | None = None


class NodeDeviceTable:
    """A versioned map of (namespace, instance name) to ``NodeDevice``."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, str], NodeDevice] = {}
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def version(self) -> int:
        return self._version

    def get(self, namespace: str, instance: str) -> NodeDevice | None:
        return self._devices.get((namespace, instance))

    def snapshot(self) -> dict[tuple[str, str], NodeDevice]:
        return dict(self._devices)

    async def put(self, device: NodeDevice) -> None:
        key = (device.namespace, device.instance)
        if self._devices.get(key) != device:
            self._devices[key] = device
            await self._bump()

    async def remove(self, namespace: str, instance: str) -> None:
        if self._devices.pop((namespace, instance), None) is not None:
            await self._bump()

    async def wait_changed(self, since: int) -> int:
        """Return once the version differs from ``since``; returns the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != since)
            return self._version

    async def _bump(self) -> None:
        async with self._changed:
            self._version += 1
            self._changed.notify_all()
