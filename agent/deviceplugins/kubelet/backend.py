"""The seam between the generic plugin lifecycle and device logic.

Serving a socket, registering with the kubelet and streaming ``ListAndWatch``
are the same for every plugin; which devices exist, whether they are healthy and what
``Allocate`` hands out are not. A ``PluginBackend`` answers the device questions in plain Python
types, a ``DeviceFeed`` carries the advertised list (deduplicated, so the kubelet only hears
about real changes), and ``PluginError`` carries the gRPC status a refusal maps to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from agent.deviceplugins.kubelet.feed import DeviceFeed
from agent.discovery.container_devices import ContainerAllocation as ContainerAllocation


class PluginError(Exception):
    """A refusal the kubelet should see as a gRPC status with a message naming the cause."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PluginBackend(Protocol):
    """Device logic behind one plugin. Every method may raise ``PluginError``."""

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        """Claim the devices of each container request; one answer per request, in order."""
        ...

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        """Pick ``size`` ids from ``available``, always including ``must_include``."""
        ...

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """Prepare the devices before a container starts (only asked when options say so)."""
        ...


@dataclass
class PluginSpec:
    """Everything the lifecycle needs to run one plugin."""

    resource_name: str
    socket_name: str
    backend: PluginBackend
    feed: DeviceFeed
    pre_start_required: bool = False
