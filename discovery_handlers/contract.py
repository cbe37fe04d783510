"""The discovery-handler contract: what every handler, built in or third party, provides.

Why this exists: the agent runs handlers it knows only by name, and third parties add handlers
by installing a package. This module is the one seam between them, and it knows nothing of
Kubernetes: a handler parses its ``discoveryDetails`` into typed details (or says which field is
wrong), then streams the full list of devices it can reach whenever that list changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Mount:
    """A host path a broker container gets mounted (for example a vendor driver directory)."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    """A device node a broker container may open; permissions are cgroup's ``r``, ``w``, ``m``."""

    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Device:
    """One discovered device.

    ``id`` must be stable across discoveries and restarts: the Instance name is derived from it.
    ``properties`` reach brokers as environment variables, so names are shell-safe identifiers.
    """

    id: str
    properties: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()


class InvalidDetails(ValueError):
    """``discoveryDetails`` (or a discovery property) the handler cannot accept.

    ``field`` names the offending field as a dotted path, e.g. ``"udevRules[2]"``, so the agent
    can report it on the Configuration's status and in an Event.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"discoveryDetails.{field}: {message}")
        self.field = field
        self.reason = message


@runtime_checkable
class DiscoveryHandler(Protocol):
    """What the agent needs of a handler. Implementations are plain objects, often singletons.

    - ``name`` is what a Configuration's ``discoveryHandler.name`` says.
    - ``shared`` is True when the devices are reachable from several nodes (network cameras,
      OPC-UA servers) and False for node-local ones (USB ports, NPUs).
    - ``parse_details`` validates ``discoveryDetails`` (YAML text) and the resolved discovery
      properties (Secret and ConfigMap values already read) and returns typed details, raising
      ``InvalidDetails`` on bad input.
    - ``discover`` yields the complete current device list at once and again every time it
      changes; it runs until cancelled. Errors it cannot recover from propagate; the agent
      reports them and restarts the run with backoff.
    """

    name: str
    shared: bool

    def parse_details(self, details: str, properties: Mapping[str, str]) -> Any: ...

    def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]: ...


@runtime_checkable
class PreparingHandler(DiscoveryHandler, Protocol):
    """A handler that must prepare a device before a container starts (e.g. reset an NPU).

    The agent then asks the kubelet for ``PreStartContainer`` and calls ``prepare`` from it.
    """

    async def prepare(self, device: Device) -> None: ...
