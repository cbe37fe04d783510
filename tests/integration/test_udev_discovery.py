"""udev discovery against real parts: this machine's /sys through the real libudev (pyudev), and
hot-plug through umockdev (the real libudev reading umockdev's emulated sysfs, /dev and uevent
sockets; see tests/harness/udev_testbed_helper.py for the USB serial devices it stands for).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery_handlers.contract import Device, DeviceSpec
from discovery_handlers.udev import handler
from discovery_handlers.udev.watch import DEBOUNCE_QUIET_S
from tests.harness.udev_testbed import DiscoveryProcess, UmockdevBed

FIRST_LIST_DEADLINE_S = 20.0
RADIO = "usb: {vendor: '0403', product: '6001'}"
STRESS_SCANS = 3000  # ~2 s of enumerations here: they overlap the plugs and unplugs
STRESS_DEADLINE_S = 120.0
PORT_1 = "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0"


async def first_list(details_text: str) -> list[Device]:
    details = handler.parse_details(details_text, {})
    stream = handler.discover(details)
    try:
        return list(await asyncio.wait_for(anext(stream), FIRST_LIST_DEADLINE_S))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def uevent_of(devpath: str) -> dict[str, str]:
    text = Path(f"/sys{devpath}/uevent").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def mem_class_nodes() -> dict[str, str]:
    """DEVPATH → node of every device the kernel lists in /sys/class/mem."""
    nodes = {}
    for name in os.listdir("/sys/class/mem"):
        devpath = os.path.realpath(f"/sys/class/mem/{name}")[len("/sys"):]
        nodes[devpath] = f"/dev/{uevent_of(devpath)['DEVNAME']}"
    return nodes


async def test_kernel_null_finds_dev_null_as_the_kernel_describes_it() -> None:
    [device] = await first_list("udevRules: ['KERNEL==\"null\"']\npermissions: rw")
    assert device.id == "/devices/virtual/mem/null"
    kernel = uevent_of(device.id)
    assert device.properties["UDEV_DEVNODE"] == f"/dev/{kernel['DEVNAME']}" == "/dev/null"
    assert device.properties["UDEV_DEVPATH"] == "/devices/virtual/mem/null"
    assert device.device_specs == (DeviceSpec("/dev/null", "/dev/null", "rw"),)
    node = os.stat("/dev/null")
    assert stat.S_ISCHR(node.st_mode)
    assert (os.major(node.st_rdev), os.minor(node.st_rdev)) == (
        int(kernel["MAJOR"]), int(kernel["MINOR"]))
    assert device.health.healthy


async def test_subsystem_mem_finds_every_mem_device_with_its_node() -> None:
    devices = await first_list("udevRules: ['SUBSYSTEM==\"mem\"']")
    expected = mem_class_nodes()
    assert {d.id: d.properties["UDEV_DEVNODE"] for d in devices} == expected
    assert {"/dev/null", "/dev/zero"} <= set(expected.values())
    for device in devices:
        [spec] = device.device_specs
        assert (spec.host_path, spec.container_path, spec.permissions) == (
            device.properties["UDEV_DEVNODE"], device.properties["UDEV_DEVNODE"], "rwm")


async def test_alternatives_and_negation_on_the_real_tree() -> None:
    devices = await first_list("udevRules: ['SUBSYSTEM==\"mem\", KERNEL==\"zero|full|nope\"',"
                               " 'KERNEL==\"null\", SUBSYSTEMS!=\"usb\"']")
    assert sorted(d.properties["UDEV_DEVNODE"] for d in devices) == [
        "/dev/full", "/dev/null", "/dev/zero"]


@pytest.fixture
def bed() -> Iterator[UmockdevBed]:
    with UmockdevBed() as test_bed:
        yield test_bed


def ids(devices: list[dict[str, Any]]) -> set[str]:
    return {d["id"] for d in devices}


def by_id(devices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in devices}


def test_plug_and_unplug_a_usb_serial_radio(bed: UmockdevBed) -> None:
    with DiscoveryProcess(bed, RADIO) as discovery:
        assert discovery.next_list()["devices"] == []
        bed.plug("1-1", "ttyUSB0", "A50285BI")
        line, _ = discovery.until(lambda ds: PORT_1 in ids(ds), what="the radio")
        radio = by_id(line["devices"])[PORT_1]
        assert radio["properties"] == {
            "UDEV_DEVPATH": PORT_1,
            "UDEV_DEVNODE": "/dev/ttyUSB0",
            "UDEV_DEVNODE_0": "/dev/ttyUSB0",
            "UDEV_DEVLINK": "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0",
            "UDEV_VENDOR_ID": "0403",
            "UDEV_PRODUCT_ID": "6001",
            "UDEV_SERIAL": "A50285BI",
            # Where the xHCI controller it hangs off sits (the standard attributes).
            "UDEV_PCIE_ROOT": "pci0000:00",
            "UDEV_NUMA_NODE": "0",
        }
        assert radio["device_specs"] == [["/dev/ttyUSB0", "/dev/ttyUSB0", "rwm"]]
        bed.unplug("1-1")
        discovery.until(lambda ds: ds == [], what="the radio gone")


def test_a_hub_of_ten_radios_yields_one_or_two_lists(bed: UmockdevBed) -> None:
    with DiscoveryProcess(bed, RADIO) as discovery:
        assert discovery.next_list()["devices"] == []
        plugged = bed.hub("1-2", 10, 10)
        line, lists = discovery.until(lambda ds: len(ds) == 10, what="ten radios")
        # One or two lists, plus one for each pause longer than the debounce that the bed
        # itself made between two uevents (a loaded machine can stall it; the kernel does
        # not), since the handler cannot tell such a pause from the burst's end.
        assert lists <= 2 + bed_pauses(plugged), f"a burst of 10 plugs gave {lists} lists"
        nodes = sorted(d["properties"]["UDEV_DEVNODE"] for d in line["devices"])
        assert nodes == sorted(f"/dev/ttyUSB{n}" for n in range(10, 20))
        unplugged = bed.unplug("1-2")
        _, lists = discovery.until(lambda ds: ds == [], what="the hub's radios gone")
        assert lists <= 2 + bed_pauses(unplugged)


def bed_pauses(reply: dict[str, Any]) -> int:
    """How many gaps between two of the bed's uevents in one operation exceeded the
    handler's debounce quiet time."""
    stamps: list[float] = reply["stamps"]
    return sum(1 for a, b in itertools.pairwise(stamps) if b - a > DEBOUNCE_QUIET_S)


def test_a_renumbered_node_keeps_the_id_and_carries_the_new_path(bed: UmockdevBed) -> None:
    bed.plug("1-1", "ttyUSB0", "A50285BI")
    with DiscoveryProcess(bed, RADIO) as discovery:
        [radio] = discovery.next_list()["devices"]
        assert (radio["id"], radio["properties"]["UDEV_DEVNODE"]) == (PORT_1, "/dev/ttyUSB0")
        bed.renumber("1-1", "ttyUSB1")
        line, _ = discovery.until(
            lambda ds: [d["properties"].get("UDEV_DEVNODE") for d in ds] == ["/dev/ttyUSB1"],
            what="the same radio at /dev/ttyUSB1")
        [radio] = line["devices"]
        assert radio["id"] == PORT_1
        assert radio["device_specs"] == [["/dev/ttyUSB1", "/dev/ttyUSB1", "rwm"]]


def test_odd_attribute_bytes_are_matched_and_cleaned_not_fatal(bed: UmockdevBed) -> None:
    bed.plug("1-1", "ttyUSB0", "A50285BI")
    rule = "udevRules: ['SUBSYSTEM==\"tty\", ATTRS{idVendor}==\"0403\", ATTRS{serial}==\"?*\"']"
    with DiscoveryProcess(bed, rule) as discovery:
        [radio] = discovery.next_list()["devices"]
        assert radio["properties"]["UDEV_SERIAL"] == "A50285BI"
        bed.odd_attribute("1-1", "serial", b"\xff\xfeA\x1bB\t\n")
        line, _ = discovery.until(
            lambda ds: [d["properties"].get("UDEV_SERIAL") for d in ds] != ["A50285BI"],
            what="the device re-read after its change event")
        [radio] = line["devices"]
        assert radio["properties"]["UDEV_SERIAL"] == "\ufffd\ufffdAB"
        assert radio["properties"]["UDEV_DEVNODE"] == "/dev/ttyUSB0"


def test_a_failed_monitor_socket_is_reopened_and_events_still_arrive(bed: UmockdevBed) -> None:
    with DiscoveryProcess(bed, RADIO) as discovery:
        first = discovery.next_list()
        assert (first["devices"], first["reopens"]) == ([], 0)
        discovery.send("break-monitor")
        assert discovery.next_line()["broke"] is True
        # umockdev's sender gives up on a socket that is shut down but still open: plug only
        # once the watcher has let go of it (a real kernel just drops such a listener)
        discovery.poll_stats(lambda stats: stats["reopens"] == 1, what="the monitor reopened")
        bed.plug("1-1", "ttyUSB0", "A50285BI")
        line, _ = discovery.until(lambda ds: PORT_1 in ids(ds), what="the radio after a reopen")
        assert line["reopens"] == 1
        assert line["full_scans"] >= 2  # events may have been lost: everything was re-read


def test_a_monitor_that_cannot_be_reopened_ends_discovery_with_a_clear_error(
    bed: UmockdevBed,
) -> None:
    with DiscoveryProcess(bed, RADIO, extra_env={"UDEV_RUNNER_ONE_MONITOR": "1"}) as discovery:
        discovery.next_list()
        discovery.send("break-monitor")
        line = discovery.line_with("failed")
        assert line["failed"] == ("MonitorFailed: udev event monitor cannot be reopened: "
                                  "[Errno 24] Too many open files")
        assert discovery.proc.wait(timeout=30) == 1


def test_devices_removed_during_enumeration_are_skipped(bed: UmockdevBed) -> None:
    with DiscoveryProcess(bed, RADIO) as discovery:
        discovery.next_list()
        discovery.send(f"scan-stress {STRESS_SCANS}")  # full enumerations back to back
        for round_ in range(10):  # radios come and go under them
            bed.plug("1-1", f"ttyUSB{round_}", "A50285BI")
            discovery.until(lambda ds: len(ds) == 1, what=f"round {round_}: the radio")
            bed.unplug("1-1")
            discovery.until(lambda ds: ds == [], what=f"round {round_}: the radio gone")
        line = discovery.line_with("scans", deadline_s=STRESS_DEADLINE_S)
        assert (line["scans"], line["errors"]) == (STRESS_SCANS, [])
