"""Akri's ``Device`` messages into the contract's ``Device``: pure, no I/O.

``convert`` returns the devices the agent can serve and a ``Refusal`` with a reason for each one it
cannot; one bad entry never hides the rest (docs/handlers/akri.md, "Seeing what runs").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from discovery_handlers.contract import Device, DeviceSpec, Mount
from discovery_handlers.external.akriapi import discovery_pb2 as pb

#: What a device spec without permissions gets, as Akri's agent gives it to the kubelet.
DEFAULT_PERMISSIONS = "rwm"
_PERMISSION_LETTERS = frozenset("rwm")


@dataclass(frozen=True)
class Refusal:
    """A device left out of the list, and why (for the log line)."""

    device_id: str
    reason: str


def convert(devices: Iterable[pb.Device]) -> tuple[list[Device], list[Refusal]]:
    """The servable devices of one ``DiscoverResponse``, in order, and the refused ones."""
    kept: list[Device] = []
    refused: list[Refusal] = []
    seen: set[str] = set()
    for message in devices:
        reason = _problem(message)
        if reason is None and message.id in seen:
            reason = "a device with this id is already in the list"
        if reason is not None:
            refused.append(Refusal(device_id=message.id, reason=reason))
            continue
        seen.add(message.id)
        kept.append(_device(message))
    return kept, refused


def _problem(message: pb.Device) -> str | None:
    if not message.id.strip():
        return "empty id (the Instance name is derived from it)"
    for index, spec in enumerate(message.device_specs):
        if not spec.host_path:
            return f"device_specs[{index}] has no host_path"
        if not spec.container_path:
            return f"device_specs[{index}] has no container_path"
        if not set(spec.permissions) <= _PERMISSION_LETTERS:
            return f"device_specs[{index}] permissions {spec.permissions!r} are not r, w, m"
    for index, mount in enumerate(message.mounts):
        if not mount.host_path:
            return f"mounts[{index}] has no host_path"
        if not mount.container_path:
            return f"mounts[{index}] has no container_path"
    return None


def _device(message: pb.Device) -> Device:
    return Device(
        id=message.id,
        properties=dict(message.properties),
        mounts=tuple(
            Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in message.mounts
        ),
        device_specs=tuple(
            DeviceSpec(
                container_path=s.container_path, host_path=s.host_path,
                permissions=s.permissions or DEFAULT_PERMISSIONS,
            )
            for s in message.device_specs
        ),
    )
