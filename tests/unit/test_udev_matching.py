"""udev matching semantics over a table: globs, alternatives, absent values, trailing
whitespace, plural keys on one parent, odd bytes. Devices are plain records (``Rec``) with the
fields libudev gives; the pure matcher is what is under test."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from discovery_handlers.udev.matching import matches
from discovery_handlers.udev.rules import parse_rule


@dataclass
class Rec:
    devpath: str
    kernel: str
    subsystem: str | None = None
    driver: str | None = None
    tags: frozenset[str] = frozenset()
    parent: Rec | None = None
    attrs: dict[str, bytes] = field(default_factory=dict)
    props: dict[str, str] = field(default_factory=dict)

    def attribute(self, name: str) -> bytes | None:
        return self.attrs.get(name)

    def property(self, name: str) -> str | None:
        return self.props.get(name)


USB = Rec("/devices/pci0000:00/0000:00:14.0/usb1/1-1", "1-1", "usb", "usb",
          attrs={"idVendor": b"0403\n", "idProduct": b"6001\n", "serial": b"A5\xff\xfeBI\n"},
          props={"DEVTYPE": "usb_device"}, tags=frozenset({"seat"}))
INTF = Rec(USB.devpath + "/1-1:1.0", "1-1:1.0", "usb", "ftdi_sio", parent=USB,
           attrs={"bInterfaceNumber": b"00\n"}, props={"DEVTYPE": "usb_interface"})
PORT = Rec(INTF.devpath + "/ttyUSB0", "ttyUSB0", "usb-serial", "ftdi_sio", parent=INTF)
TTY = Rec(PORT.devpath + "/tty/ttyUSB0", "ttyUSB0", "tty", parent=PORT,
          props={"DEVNAME": "/dev/ttyUSB0", "ID_SERIAL": "FTDI_FT232R"},
          tags=frozenset({"systemd", "uaccess"}), attrs={"dev": b"188:0\n", "pad": b"x  "})
NULL = Rec("/devices/virtual/mem/null", "null", "mem", props={"DEVNAME": "/dev/null"})

TABLE = [
    ('KERNEL=="ttyUSB0"', TTY, True),
    ('KERNEL=="ttyUSB[0-9]*"', TTY, True),
    ('KERNEL=="ttyUSB[!0]"', TTY, False),
    ('KERNEL=="tty?SB0"', TTY, True),
    ('KERNEL=="ttyACM*|ttyUSB*"', TTY, True),
    ('KERNEL=="ttyACM*|ttyS*"', TTY, False),
    ('KERNEL=="ttyUSB"', TTY, False),  # anchored: a prefix is not a match
    ('KERNEL!="ttyUSB0"', TTY, False),
    ('SUBSYSTEM=="tty"', TTY, True),
    ('SUBSYSTEM=="usb"', TTY, False),  # singular: the device only
    ('SUBSYSTEMS=="usb"', TTY, True),  # plural: the device or a parent
    ('SUBSYSTEMS=="pci"', TTY, False),
    ('DEVPATH=="/devices/pci*/ttyUSB0"', TTY, True),  # '*' crosses '/' (fnmatch without flags)
    ('DRIVER=="ftdi_sio"', TTY, False),  # the tty itself has no driver
    ('DRIVER==""', TTY, True),  # absent reads as empty
    ('DRIVERS=="ftdi_sio"', TTY, True),
    ('ATTR{dev}=="188:0"', TTY, True),  # trailing newline ignored
    ('ATTR{pad}=="x"', TTY, True),
    ('ATTR{pad}=="x  "', TTY, True),  # pattern ending in space keeps trailing space
    ('ATTR{pad}=="x "', TTY, False),
    ('ATTR{missing}==""', TTY, True),
    ('ATTR{missing}!="1"', TTY, True),
    ('ATTR{idVendor}=="0403"', TTY, False),  # ATTR: the device only
    ('ATTRS{idVendor}=="0403"', TTY, True),
    ('ATTRS{idVendor}=="0403", ATTRS{idProduct}=="6001"', TTY, True),
    # plural clauses must hold on ONE device: bInterfaceNumber lives on the interface,
    # idVendor on the USB device, so together they never match (udev's reading)
    ('ATTRS{idVendor}=="0403", ATTRS{bInterfaceNumber}=="00"', TTY, False),
    ('KERNELS=="1-1:1.0", DRIVERS=="ftdi_sio"', TTY, True),
    ('KERNELS=="1-1", DRIVERS=="ftdi_sio"', TTY, False),
    ('KERNELS=="1-1", SUBSYSTEMS!="usb-serial"', TTY, True),  # '!=' tested on that same device
    ('ATTRS{serial}=="A5*BI"', TTY, True),  # odd bytes match only wildcards
    ('ATTRS{serial}=="A5BI"', TTY, False),
    ('ENV{ID_SERIAL}=="FTDI_*"', TTY, True),
    ('ENV{ID_SERIAL}!="FTDI_*"', TTY, False),
    ('ENV{NOPE}==""', TTY, True),
    ('ENV{NOPE}=="?*"', TTY, False),
    ('TAG=="uaccess"', TTY, True),
    ('TAG=="seat"', TTY, False),
    ('TAG!="seat"', TTY, True),
    ('TAGS=="seat"', TTY, True),
    ('SUBSYSTEM=="mem", KERNEL=="null|zero"', NULL, True),
    ('SUBSYSTEM=="mem", KERNEL=="zero"', NULL, False),
    ('SUBSYSTEMS=="usb"', NULL, False),
    ('KERNEL=="null", ATTRS{x}!="y"', NULL, True),
]


@pytest.mark.parametrize(("rule", "device", "expected"), TABLE,
                         ids=[f"{r}-{d.kernel}" for r, d, _ in TABLE])
def test_rule_matches_as_udev_does(rule: str, device: Rec, expected: bool) -> None:
    assert matches(parse_rule(rule), device) is expected


def test_a_parent_chain_that_loops_is_bounded() -> None:
    looped = Rec("/devices/a", "a", "x")
    looped.parent = looped
    assert matches(parse_rule('SUBSYSTEMS=="nope"'), looped) is False
