"""Plain records the emulated kubelet keeps and hands to tests.

The node emulator's parts (device manager, pod admission, pod-resources server)
and the tests that read the emulator's state share these few immutable records; keeping them in
one small module lets every part import them without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from tests.harness.cdi import CdiEdits

#: The one device-plugin API version this kubelet speaks.
DEVICE_PLUGIN_VERSION = "v1beta1"
HEALTHY = "Healthy"

# Resource names the kubelet treats as native (not extended): no domain, or kubernetes.io.
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def is_extended_resource_name(name: str) -> bool:
    """True for names like ``vendor.example/gpu``, as the kubelet's own check decides."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain, _, short = name.partition("/")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return bool(domain) and bool(_QUALIFIED_NAME.match(short)) and len(short) <= 63


@dataclass(frozen=True)
class ContainerAllocation:
    """What one Allocate call returned for one container of a pod."""

    resource_name: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    mounts: tuple[tuple[str, str, bool], ...]  # (container_path, host_path, read_only)
    devices: tuple[tuple[str, str, str], ...]  # (container_path, host_path, permissions)
    cdi_devices: tuple[str, ...]
    annotations: Mapping[str, str]
    container: str = ""  # the container's name in the pod spec
    init_container: bool = False
    #: What the runtime injected for the container's CDI names (None: none, or CDI disabled).
    cdi_edits: CdiEdits | None = None


@dataclass(frozen=True)
class Registration:
    """One accepted RegisterRequest on kubelet.sock."""

    resource_name: str
    endpoint: str
    time: datetime
    pre_start_required: bool
    get_preferred_allocation_available: bool
