"""The standard DRA attributes ``resource.kubernetes.io/pcieRoot`` and ``numaNode``:
read from this machine's own sysfs and from trees laid out as the kernel lays them out, carried
by the udev and Ascend handlers' properties, published typed in a slice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pyudev

from crds import dra, dra_slices
from crds.instance import Instance, InstanceSpec
from discovery_handlers import pci
from discovery_handlers.ascend.chips import Chip
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.devices import PROP_NUMA_NODE, PROP_PCIE_ROOT, to_device
from discovery_handlers.contract import HEALTHY
from discovery_handlers.udev import udevlib
from discovery_handlers.udev.devices import NodeRecord, build_devices

HOST_PCI = Path("/sys/bus/pci/devices")


def _host_pci_devices() -> list[str]:
    if not HOST_PCI.is_dir() or not any(HOST_PCI.iterdir()):
        pytest.skip("this machine's sysfs lists no PCI device")
    return sorted(p.name for p in HOST_PCI.iterdir())


def test_this_machines_pci_devices_as_the_kernel_places_them() -> None:
    for bus_id in _host_pci_devices():
        real = os.path.realpath(HOST_PCI / bus_id)
        found = pci.locate_bus_id(bus_id.upper())
        # The root is the first directory below /sys/devices; the node the device's own file.
        assert found["pcie_root"] == real.split("/")[3], real
        assert pci.ROOT.match(found["pcie_root"])
        numa = int((Path(real) / "numa_node").read_text())
        assert found.get("numa_node") == (str(numa) if numa >= 0 else None), real


def test_a_real_pci_device_through_pyudev_becomes_udev_properties() -> None:
    """The udev handler's own read (``udevlib.record_of``) of a real PCI device."""
    bus_id = _host_pci_devices()[0]
    device = pyudev.Devices.from_sys_path(pyudev.Context(), str(HOST_PCI / bus_id))
    record = udevlib.record_of(udevlib.View(device))
    real = os.path.realpath(HOST_PCI / bus_id)
    assert record.pcie_root == real.split("/")[3]
    numa = int((Path(real) / "numa_node").read_text())
    assert record.numa_node == (str(numa) if numa >= 0 else None)


def _tree(tmp_path: Path, numa: int) -> Path:
    """A USB serial adapter behind an xHCI controller on NUMA node ``numa``."""
    controller = tmp_path / "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    controller.mkdir(parents=True)
    (controller / "numa_node").write_text(f"{numa}\n")
    tty = controller / "usb3/3-1/3-1:1.0/ttyUSB0/tty/ttyUSB0"
    tty.mkdir(parents=True)
    links = tmp_path / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:81:00.0").symlink_to("../../../devices/pci0000:80/0000:80:01.0/0000:81:00.0")
    return tty


def test_a_device_below_a_pci_device_takes_its_root_and_numa_node(tmp_path: Path) -> None:
    tty = _tree(tmp_path, 1)
    assert pci.locate(str(tty)) == {"pcie_root": "pci0000:80", "numa_node": "1"}
    assert pci.locate_bus_id("0000:81:00.0", sys_root=str(tmp_path / "sys")) == {
        "pcie_root": "pci0000:80", "numa_node": "1"}
    # The same path as udev's DEVPATH (no /sys): the root is known, the file is not read.
    assert pci.pcie_root("/devices/pci0000:80/0000:80:01.0/0000:81:00.0") == "pci0000:80"


def test_no_affinity_unknown_ids_and_non_pci_devices_publish_nothing(tmp_path: Path) -> None:
    tty = _tree(tmp_path, -1)
    assert pci.locate(str(tty)) == {"pcie_root": "pci0000:80"}  # numa_node -1: left out
    sys_root = str(tmp_path / "sys")
    assert pci.locate_bus_id("0000:99:00.0", sys_root=sys_root) == {}
    assert pci.locate_bus_id("not-a-bus-id", sys_root=sys_root) == {}
    assert pci.locate("/sys/devices/platform/serial8250/tty/ttyS0") == {}
    assert pci.locate("/sys/devices/virtual/net/lo") == {}


def test_handlers_carry_them_as_properties() -> None:
    (usb,) = build_devices([NodeRecord(devpath="/devices/pci0000:80/0000:80:01.0/x",
                                       pcie_root="pci0000:80", numa_node="1")],
                           group_recursive=False, permissions="rw")
    assert (usb.properties["UDEV_PCIE_ROOT"], usb.properties["UDEV_NUMA_NODE"]) == (
        "pci0000:80", "1")
    (plain,) = build_devices([NodeRecord(devpath="/devices/platform/x")],
                             group_recursive=False, permissions="rw")
    assert "UDEV_PCIE_ROOT" not in plain.properties
    chip = Chip(phy_id=3, bus_id="0000:C4:00.0")
    npu = to_device(chip, AscendDetails(), shared_present=(), driver_present=False,
                    health=HEALTHY, pci={"pcie_root": "pci0000:c0", "numa_node": "0"})
    assert (npu.properties[PROP_PCIE_ROOT], npu.properties[PROP_NUMA_NODE]) == (
        "pci0000:c0", "0")
    bare = to_device(chip, AscendDetails(), shared_present=(), driver_present=False,
                     health=HEALTHY)
    assert PROP_PCIE_ROOT not in bare.properties


@pytest.mark.parametrize(("props", "standard"), [
    ({"UDEV_PCIE_ROOT": "pci0000:80", "UDEV_NUMA_NODE": "1"},
     {dra.ATTR_PCIE_ROOT: "pci0000:80", dra.ATTR_NUMA_NODE: 1}),
    ({"ASCEND_PCIE_ROOT": "pci0001:c0", "ASCEND_NUMA_NODE": "0"},
     {dra.ATTR_PCIE_ROOT: "pci0001:c0", dra.ATTR_NUMA_NODE: 0}),
    # Not in Kubernetes' form (a brokerProperty set by hand, say): not published under them.
    ({"UDEV_PCIE_ROOT": "0000:80", "UDEV_NUMA_NODE": "-1"}, {}),
    ({"PCIE_ROOT": "pci0000:80"}, {}),
])
def test_standard_attributes_only_in_kubernetes_form(props: dict[str, str],
                                                     standard: dict[str, int | str]) -> None:
    assert dra.standard_attributes(props) == standard


def test_the_slice_lists_them_typed_in_their_own_domain() -> None:
    inst = Instance(name="npu-000003", namespace="ns", spec=InstanceSpec(
        configuration_name="npu", nodes=("n1",),
        broker_properties={"ASCEND_PCIE_ROOT": "pci0000:c0", "ASCEND_NUMA_NODE": "1"}))
    body, _ = dra_slices.device(inst, shared=False, unhealthy=None)
    assert body["attributes"][dra.ATTR_PCIE_ROOT] == {"string": "pci0000:c0"}
    assert body["attributes"][dra.ATTR_NUMA_NODE] == {"int": 1}
    assert body["attributes"]["ascend_numa_node"] == {"string": "1"}
