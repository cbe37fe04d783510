"""Device ids, grouping and broker properties from matched records (the pure part of discovery),
and the ``usb`` shorthand and option fields of ``discoveryDetails``."""

from __future__ import annotations

import pytest

from discovery_handlers.contract import DeviceSpec, InvalidDetails
from discovery_handlers.udev import handler
from discovery_handlers.udev.details import usb_rule
from discovery_handlers.udev.devices import NodeRecord, build_devices, clean_value, stable_link
from discovery_handlers.udev.matching import matches
from tests.unit.test_udev_matching import NULL, PORT, TTY, USB

USB_PATH = "/devices/pci0000:00/0000:00:14.0/usb1/1-1"
TTY_REC = NodeRecord(devpath=f"{USB_PATH}/1-1:1.0/ttyUSB0/tty/ttyUSB0", devnode="/dev/ttyUSB0",
                     devlinks=("/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0",
                               "/dev/serial/by-id/usb-FTDI_FT232R_A50285BI-if00-port0"),
                     vendor_id="0403", product_id="6001", serial="A50285BI")
USB_REC = NodeRecord(devpath=USB_PATH, devnode="/dev/bus/usb/001/002", vendor_id="0403")
INTF_REC = NodeRecord(devpath=f"{USB_PATH}/1-1:1.0", ancestor_node="/dev/bus/usb/001/002")
SOUND = NodeRecord(devpath="/devices/pci0000:00/0000:00:1f.3/sound/card0")


def test_one_device_per_node_with_akri_properties_and_ours() -> None:
    [device] = build_devices([TTY_REC], group_recursive=False, permissions="rw")
    assert device.id == TTY_REC.devpath
    assert device.properties == {
        "UDEV_DEVPATH": TTY_REC.devpath,
        "UDEV_DEVNODE": "/dev/ttyUSB0",
        "UDEV_DEVLINK": "/dev/serial/by-id/usb-FTDI_FT232R_A50285BI-if00-port0",
        "UDEV_VENDOR_ID": "0403",
        "UDEV_PRODUCT_ID": "6001",
        "UDEV_SERIAL": "A50285BI",
    }
    assert device.device_specs == (DeviceSpec("/dev/ttyUSB0", "/dev/ttyUSB0", "rw"),)


def test_a_device_without_a_node_takes_its_ancestors_or_has_none() -> None:
    intf, sound = build_devices([SOUND, INTF_REC], group_recursive=False, permissions="rwm")
    assert intf.id == INTF_REC.devpath
    assert intf.properties["UDEV_DEVNODE"] == "/dev/bus/usb/001/002"
    assert [s.host_path for s in intf.device_specs] == ["/dev/bus/usb/001/002"]
    assert sound.device_specs == ()
    assert sound.properties == {"UDEV_DEVPATH": SOUND.devpath}


def test_grouping_joins_children_under_the_top_most_matched_parent() -> None:
    sibling = NodeRecord(devpath=f"{USB_PATH}-other/x", devnode="/dev/x")  # not a child
    devices = build_devices([TTY_REC, sibling, USB_REC, INTF_REC], group_recursive=True,
                            permissions="rwm")
    assert [d.id for d in devices] == [USB_PATH, sibling.devpath]
    group = devices[0]
    assert group.properties["UDEV_DEVPATH"] == USB_PATH
    assert group.properties["UDEV_DEVNODE"] == "/dev/bus/usb/001/002"
    assert group.properties["UDEV_DEVNODE_0"] == "/dev/bus/usb/001/002"
    assert group.properties["UDEV_DEVNODE_1"] == "/dev/ttyUSB0"
    assert "UDEV_DEVNODE_2" not in group.properties  # the interface's borrowed node is the same
    assert [s.host_path for s in group.device_specs] == ["/dev/bus/usb/001/002", "/dev/ttyUSB0"]
    assert devices[1].properties["UDEV_DEVNODE_0"] == "/dev/x"


def test_without_grouping_each_matched_device_is_its_own() -> None:
    devices = build_devices([TTY_REC, USB_REC], group_recursive=False, permissions="rwm")
    assert [d.id for d in devices] == [USB_PATH, TTY_REC.devpath]
    assert all("UDEV_DEVNODE_0" not in d.properties for d in devices)


@pytest.mark.parametrize(("links", "expected"), [
    ((), None),
    (("/dev/char/188:0",), None),
    (("/dev/serial/by-path/p", "/dev/serial/by-id/i"), "/dev/serial/by-id/i"),
    (("/dev/v4l/by-path/p",), "/dev/v4l/by-path/p"),
])
def test_stable_link_prefers_by_id(links: tuple[str, ...], expected: str | None) -> None:
    assert stable_link(links) == expected


@pytest.mark.parametrize(("raw", "expected"), [
    ("A50285BI", "A50285BI"), ("  x\n", "x"), ("A5\ufffd\ufffdBI", "A5\ufffd\ufffdBI"),
    ("a\x00b\x1bc", "abc"), ("\udcff", None), ("", None), (None, None),
])
def test_property_values_are_made_safe_for_the_environment(raw: str | None,
                                                           expected: str | None) -> None:
    assert clean_value(raw) == expected


def test_usb_shorthand_matches_the_nodes_below_that_device_only() -> None:
    rule = usb_rule({"vendor": "0403", "product": "6001"})
    assert matches(rule, TTY) is True
    assert matches(rule, USB) is False  # the USB device's own node is not a radio
    assert matches(rule, PORT) is False  # no node
    assert matches(rule, NULL) is False
    assert matches(usb_rule({"vendor": "0403", "product": "6002"}), TTY) is False
    assert matches(usb_rule({"vendor": "0403", "product": "6001", "interface": 0}), TTY) is True
    assert matches(usb_rule({"vendor": "0403", "product": "6001", "interface": 1}), TTY) is False
    assert matches(usb_rule({"vendor": "0403", "product": "6001", "serial": "A5*"}), TTY) is False


DETAILS_TABLE = [
    ("usb: {vendor: '0403'}", "usb.product", "4 hex digits"),
    ("usb: {vendor: 0403, product: '6001'}", "usb.vendor", "quoted string"),
    ("usb: {vendor: '0403', product: '6001', speed: 12}", "usb.speed", "unknown field"),
    ("usb: {vendor: '0403', product: '6001', interface: 300}", "usb.interface", "0-255"),
    ("usb: {vendor: '0403', product: '6001', serial: ''}", "usb.serial", "non-empty"),
    ("usb: [0403]", "usb", "mapping"),
    ("udevRules: []", "udevRules", "non-empty"),
    ("udevRules: 'KERNEL==\"x\"'", "udevRules", "list of rule strings"),
    ("udevRules: ['KERNEL==\"x\"']\ngroupRecursive: yes please", "groupRecursive", "true or false"),
    ("udevRules: ['KERNEL==\"x\"']\npermissions: rwx", "permissions", "one of r w m rw rm wm rwm"),
    ("udevRules: ['KERNEL==\"x\"']\nudevRule: []", "udevRule", "unknown field"),
    ("", "udevRules", "required"),
    ("[1, 2]", "(root)", "mapping"),
    ("udevRules: [", "(root)", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "field", "words"), DETAILS_TABLE,
                         ids=[t for t, _, _ in DETAILS_TABLE])
def test_bad_details_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(text, {})
    assert caught.value.field == field
    assert words in caught.value.reason


def test_details_defaults_and_akri_fields() -> None:
    parsed = handler.parse_details("udevRules: ['KERNEL==\"null\"']", {})
    assert (parsed.group_recursive, parsed.permissions, parsed.shared) == (False, "rwm", False)
    parsed = handler.parse_details(
        "udevRules: ['KERNEL==\"null\"']\ngroupRecursive: true\npermissions: r\n"
        "usb: {vendor: '0403', product: '6001'}", {})
    assert (parsed.group_recursive, parsed.permissions, len(parsed.rules)) == (True, "r", 2)
    assert handler.shared is False


def test_usb_devices_are_one_per_interface_with_the_interface_path_as_id() -> None:
    intf = f"{USB_PATH}/1-1:1.0"
    first = NodeRecord(devpath=f"{intf}/ttyUSB1/tty/ttyUSB1", devnode="/dev/ttyUSB1", anchor=intf)
    second = NodeRecord(devpath=f"{intf}/ttyUSB0/tty/ttyUSB0", devnode="/dev/ttyUSB0", anchor=intf)
    [device] = build_devices([first, second], group_recursive=False, permissions="rw")
    assert device.id == intf
    assert device.properties["UDEV_DEVPATH"] == intf
    assert [device.properties[f"UDEV_DEVNODE_{i}"] for i in (0, 1)] == [
        "/dev/ttyUSB0", "/dev/ttyUSB1"]
    renumbered = NodeRecord(devpath=f"{intf}/ttyUSB2/tty/ttyUSB2", devnode="/dev/ttyUSB2",
                            anchor=intf)
    [again] = build_devices([renumbered], group_recursive=False, permissions="rw")
    assert again.id == device.id
    assert again.properties["UDEV_DEVNODE"] == "/dev/ttyUSB2"


@pytest.mark.parametrize(("events", "roots"), [
    ([("add", "/sys/a"), ("add", "/sys/a/b"), ("add", "/sys/a/b/c")], ["/sys/a"]),
    ([("remove", "/sys/a/b"), ("add", "/sys/a-x")], ["/sys/a-x", "/sys/a/b"]),
    ([("move", "/sys/n/new")], ["/sys/n/new", "/sys/o/old"]),
    ([], []),
])
def test_a_burst_rereads_only_its_top_most_subtrees(events: list[tuple[str, str]],
                                                     roots: list[str]) -> None:
    from discovery_handlers.udev.udevlib import Event
    from discovery_handlers.udev.watch import rescan_roots

    burst = [Event(action=a, sys_path=p, old_sys_path="/sys/o/old" if a == "move" else None)
             for a, p in events]
    assert rescan_roots(burst) == roots
