"""Where a device sits on the host's PCI topology, read from sysfs: its PCIe root complex and NUMA
node, for the standard DRA attributes ``pcieRoot`` and ``numaNode``.

``locate`` (a sysfs path) and ``locate_bus_id`` (a PCI bus id) return the properties; reads never
raise. Meaning: docs/handlers.md, "Shared helpers".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Final

#: ``pci<domain>:<bus>`` as sysfs names a root complex (and Kubernetes' attribute holds it).
ROOT: Final = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
#: A PCI device's directory name: the extended BDF, ``<domain>:<bus>:<device>.<function>``.
BUS_ID: Final = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pcie_root(path: str) -> str | None:
    """The root complex of a sysfs path (``/sys/devices/pci0000:00/...``, or a DEVPATH
    ``/devices/pci0000:00/...``); None where it is not below one."""
    parts = PurePosixPath(path).parts
    for index, part in enumerate(parts[:-1]):
        if part == "devices" and ROOT.match(parts[index + 1]):
            return parts[index + 1]
    return None


def pci_device_dir(path: str) -> str | None:
    """The deepest PCI device directory on a sysfs path (the device itself, or the PCI device
    it hangs off: a USB host controller, a bridge); None where there is none."""
    parts = PurePosixPath(path).parts
    for end in range(len(parts), 0, -1):
        if BUS_ID.match(parts[end - 1]):
            return str(PurePosixPath(*parts[:end]))
    return None


def numa_node(device_dir: str) -> int | None:
    """A PCI device directory's ``numa_node``; None where it is -1, absent or unreadable."""
    try:
        with open(os.path.join(device_dir, "numa_node"), encoding="ascii") as file:
            value = int(file.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def locate(sys_path: str) -> Mapping[str, str]:
    """``{"pcie_root": ..., "numa_node": ...}`` for a device's sysfs path (whichever is known),
    the NUMA node of the nearest PCI device on it."""
    found: dict[str, str] = {}
    root = pcie_root(sys_path)
    if root is None:
        return found
    found["pcie_root"] = root
    device = pci_device_dir(sys_path)
    node = numa_node(device) if device is not None else None
    if node is not None:
        found["numa_node"] = str(node)
    return found


def locate_bus_id(bus_id: str, *, sys_root: str = "/sys") -> Mapping[str, str]:
    """``locate`` for a PCI bus id (``0000:C1:00.0``, any case), through
    ``<sys_root>/bus/pci/devices/<bus id>``; nothing where the id is malformed or unknown."""
    bus_id = bus_id.strip().lower()
    if not BUS_ID.match(bus_id):
        return {}
    try:
        real = os.path.realpath(os.path.join(sys_root, "bus", "pci", "devices", bus_id),
                                strict=True)
    except OSError:
        return {}
    return locate(real)
