"""What one container gets for the devices it is given, whichever allocator gives them.

``container_allocation`` builds the environment, mounts, device nodes and CDI names for both the
device plugins and the DRA plugin, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.discovery.node_devices import NodeDevice
from crds.naming import FALLBACK_SEPARATOR
from discovery_handlers.contract import ComposingHandler, DeviceSpec, Mount


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets for the devices allocated to it."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


def instance_hash(instance_name: str) -> str:
    """The digest suffix of an Instance name (``<configuration>-<digest>``, or a fallback
    name's part before its node: ``crds.naming.fallback_instance_name``), upper case."""
    return instance_name.partition(FALLBACK_SEPARATOR)[0].rpartition("-")[2].upper()


def broker_envs(instance_name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Every property as ``KEY`` and ``KEY_<HASH>`` (two devices of a kind don't collide)."""
    suffix = instance_hash(instance_name)
    envs: dict[str, str] = {}
    for key, value in properties.items():
        envs[key] = value
        envs[f"{key}_{suffix}"] = value
    return envs


def container_allocation(devices: Sequence[NodeDevice]) -> ContainerAllocation:
    """What one container gets for ``devices`` (in allocation order).

    The environment is the handler's to compose when it can (``ComposingHandler``: e.g.
    ``ASCEND_VISIBLE_DEVICES=0,1``), with the Configuration's ``brokerProperties`` on top; else
    every device's properties as ``NAME_<HASH>`` and ``NAME`` (Akri's way). Mounts and device
    nodes are the union; a CDI name is given for each device whose spec is on disk.
    """
    envs: dict[str, str] = {}
    first = devices[0] if devices else None
    if first is not None and isinstance(first.handler, ComposingHandler):
        envs.update(first.handler.compose(first.details, [d.device for d in devices]))
        for device in devices:
            envs.update(device.broker_properties)
    else:
        for device in devices:
            envs.update(broker_envs(device.instance, device.properties))
    mounts: list[Mount] = []
    specs: list[DeviceSpec] = []
    cdi: list[str] = []
    for device in devices:
        mounts.extend(m for m in device.device.mounts if m not in mounts)
        specs.extend(s for s in device.device.device_specs if s not in specs)
        if device.cdi_name and device.cdi_name not in cdi:
            cdi.append(device.cdi_name)
    return ContainerAllocation(
        envs=envs, mounts=tuple(mounts), device_specs=tuple(specs), cdi_devices=tuple(cdi)
    )
