"""Turn matched udev devices into contract ``Device`` values: ids, grouping, properties, device
specs. Pure: no I/O.

What each id and property is, and how grouping works: docs/handlers/udev.md, "What a broker gets"
and "Inside the handler".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from discovery_handlers.contract import Device, DeviceSpec

DEVNODE_PROPERTY = "UDEV_DEVNODE"
DEVPATH_PROPERTY = "UDEV_DEVPATH"
DEVLINK_PROPERTY = "UDEV_DEVLINK"
VENDOR_PROPERTY = "UDEV_VENDOR_ID"
PRODUCT_PROPERTY = "UDEV_PRODUCT_ID"
SERIAL_PROPERTY = "UDEV_SERIAL"
PCIE_ROOT_PROPERTY = "UDEV_PCIE_ROOT"
NUMA_NODE_PROPERTY = "UDEV_NUMA_NODE"
#: Link directories in order of preference: by-id names survive a move to another port.
STABLE_LINK_PREFIXES = ("/dev/serial/by-id/", "/dev/disk/by-id/", "/dev/v4l/by-id/",
                        "/dev/input/by-id/", "/dev/serial/by-path/", "/dev/v4l/by-path/",
                        "/dev/input/by-path/", "/dev/disk/by-path/")
MAX_PROPERTY_CHARS = 1024


@dataclass(frozen=True)
class NodeRecord:
    """What discovery keeps of one matched udev device."""

    devpath: str
    devnode: str | None = None
    ancestor_node: str | None = None  # the nearest ancestor's node, for a device without one
    devlinks: tuple[str, ...] = ()
    vendor_id: str | None = None
    product_id: str | None = None
    serial: str | None = None
    anchor: str | None = None  # the ``usb`` shorthand's: its interface's DEVPATH, the id
    pcie_root: str | None = None  # ``pci<domain>:<bus>`` of its sysfs path
    numa_node: str | None = None  # of the nearest PCI device on its sysfs path (not -1)

    @property
    def node(self) -> str | None:
        return self.devnode or self.ancestor_node


def build_devices(records: Iterable[NodeRecord], *, group_recursive: bool,
                  permissions: str) -> list[Device]:
    """The device list for ``records`` (any order), sorted by id."""
    ordered = sorted(records, key=lambda r: r.devpath)
    anchored: dict[str, list[NodeRecord]] = {}
    for record in ordered:
        if record.anchor:
            anchored.setdefault(record.anchor, []).append(record)
    devices = [_device(members, permissions=permissions, grouped=True, id=anchor)
               for anchor, members in anchored.items()]
    ordered = [r for r in ordered if not r.anchor]
    if not group_recursive:
        devices += [_device([r], permissions=permissions, grouped=False) for r in ordered]
    else:
        groups: dict[str, list[NodeRecord]] = {}
        for record in ordered:
            top = next((p for p in _ancestor_paths(record.devpath) if p in groups), None)
            groups.setdefault(top or record.devpath, []).append(record)
        devices += [_device(members, permissions=permissions, grouped=True)
                    for members in groups.values()]
    return sorted(devices, key=lambda d: d.id)


def _ancestor_paths(devpath: str) -> Iterable[str]:
    """``/a/b/c`` → ``/a``, ``/a/b`` (top-most first, so the group's top wins)."""
    parts = devpath.split("/")
    for end in range(2, len(parts)):
        yield "/".join(parts[:end])


def _device(members: Sequence[NodeRecord], *, permissions: str, grouped: bool,
            id: str | None = None) -> Device:
    device_id = id or members[0].devpath
    properties: dict[str, str] = {DEVPATH_PROPERTY: device_id}
    nodes = list(dict.fromkeys(n for n in (m.node for m in members) if n))
    if nodes:
        properties[DEVNODE_PROPERTY] = nodes[0]
    if grouped:
        for index, node in enumerate(nodes):
            properties[f"{DEVNODE_PROPERTY}_{index}"] = node
    link = next((lk for lk in (stable_link(m.devlinks) for m in members) if lk), None)
    if link:
        properties[DEVLINK_PROPERTY] = link
    for name, values in ((VENDOR_PROPERTY, (m.vendor_id for m in members)),
                         (PRODUCT_PROPERTY, (m.product_id for m in members)),
                         (SERIAL_PROPERTY, (m.serial for m in members)),
                         (PCIE_ROOT_PROPERTY, (m.pcie_root for m in members)),
                         (NUMA_NODE_PROPERTY, (m.numa_node for m in members))):
        value = next((v for v in (clean_value(x) for x in values) if v), None)
        if value:
            properties[name] = value
    specs = tuple(DeviceSpec(container_path=n, host_path=n, permissions=permissions)
                  for n in nodes)
    return Device(id=device_id, properties=properties, device_specs=specs)


def stable_link(devlinks: Sequence[str]) -> str | None:
    """The most stable of udev's links for a node, None when udev made none."""
    for prefix in STABLE_LINK_PREFIXES:
        for link in sorted(devlinks):
            if link.startswith(prefix):
                return link
    return None


def clean_value(value: str | None) -> str | None:
    """A property value safe for an environment variable: printable, bounded; else None."""
    if value is None:
        return None
    text = "".join(c for c in value if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF)
    text = text.strip()[:MAX_PROPERTY_CHARS]
    return text or None
