"""Stable names for Instances, their CDI devices, slots and kubelet resources.

The names are Akri's, so a user who predicted an Akri Instance name (GitOps, pods that request
``akri.sh/<instance>``) predicts edgeplug's by swapping the domain. An Instance is
``<configuration>-<digest>``: the digest is a 3-byte BLAKE2b of the device id, with the node name
appended to the id first when the device is not shared, so every agent that sees one shared device
names it alike while two nodes' local devices with equal ids stay apart.
"""

from __future__ import annotations

import hashlib
from typing import Final

from crds.api import GROUP

DIGEST_BYTES: Final = 3
#: Characters Akri replaces by ``-`` to keep names valid Kubernetes object names.
_NAME_REPLACED: Final = (".", "/")


def instance_digest(device_id: str, *, shared: bool, node: str) -> str:
    """The 6 hex characters that identify a device within its Configuration."""
    material = device_id if shared else f"{device_id}{node}"
    return hashlib.blake2b(material.encode("utf-8"), digest_size=DIGEST_BYTES).hexdigest()


def _sanitise(name: str) -> str:
    for char in _NAME_REPLACED:
        name = name.replace(char, "-")
    return name


def instance_name_from_digest(configuration: str, digest: str) -> str:
    """``<configuration>-<digest>``, with ``.`` and ``/`` turned into ``-`` as Akri does."""
    return _sanitise(f"{configuration}-{digest}")


def instance_name(configuration: str, device_id: str, *, shared: bool, node: str) -> str:
    """The name of the Instance for ``device_id`` discovered through ``configuration``."""
    digest = instance_digest(device_id, shared=shared, node=node)
    return instance_name_from_digest(configuration, digest)


def cdi_name(configuration: str, digest: str) -> str:
    """The fully qualified CDI device name: ``edgeplug.io/<configuration>=<digest>``."""
    return f"{GROUP}/{configuration}={digest}"


def slot_id(instance: str, index: int) -> str:
    """The kubelet device id of slot ``index`` of ``instance`` (Akri: ``<instance>-<index>``)."""
    if index < 0:
        raise ValueError(f"slot index must be >= 0, got {index}")
    return f"{instance}-{index}"


def slot_index(instance: str, slot: str) -> int:
    """The index of ``slot`` in ``instance``; ``ValueError`` when it is not one of its slots."""
    prefix = f"{instance}-"
    suffix = slot[len(prefix):] if slot.startswith(prefix) else ""
    if not suffix.isdecimal():
        raise ValueError(f"{slot!r} is not a slot of Instance {instance!r}")
    return int(suffix)


def instance_resource_name(instance: str) -> str:
    """The extended resource the Instance's device plugin serves: ``edgeplug.io/<instance>``."""
    return f"{GROUP}/{instance}"


def configuration_resource_name(configuration: str, resource_name_override: str | None) -> str:
    """The configuration-level resource: the override if set, else ``edgeplug.io/<config>``."""
    if resource_name_override:
        return resource_name_override
    return f"{GROUP}/{_sanitise(configuration)}"
