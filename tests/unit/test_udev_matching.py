"""udev matching semantics over tables: globs, alternatives, absent values, trailing
whitespace, plural keys on one parent, odd bytes, and each case where udev's own engine answers
other than a plain reading of the rule would, named. Devices are plain records (``Rec``) with
the fields libudev gives (an attribute that cannot be read is absent, as libudev reports it);
the pure matcher is what is under test. tests/integration/test_udev_oracle.py checks the same
against udevadm."""

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
    ('ATTR{missing}==""', TTY, False),  # cannot be read: false for == and != alike
    ('ATTR{missing}!="1"', TTY, False),
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
    ('KERNEL=="null", ATTRS{x}!="y"', NULL, False),  # no device in the chain can read x
]


@pytest.mark.parametrize(("rule", "device", "expected"), TABLE,
                         ids=[f"{r}-{d.kernel}" for r, d, _ in TABLE])
def test_rule_matches_as_udev_does(rule: str, device: Rec, expected: bool) -> None:
    assert matches(parse_rule(rule), device) is expected


def test_a_parent_chain_that_loops_is_bounded() -> None:
    looped = Rec("/devices/a", "a", "x")
    looped.parent = looped
    assert matches(parse_rule('SUBSYSTEMS=="nope"'), looped) is False


# A network link as sysfs shows it: ``carrier`` reads 1 (up), 0 (up, no carrier) or cannot be
# read at all (EINVAL while the link is down; libudev reports it absent).
LINK_UP = Rec("/devices/virtual/net/v2", "v2", "net", attrs={"carrier": b"1\n"})
NO_CARRIER = Rec("/devices/virtual/net/v0", "v0", "net", attrs={"carrier": b"0\n"})
LINK_DOWN = Rec("/devices/virtual/net/v1", "v1", "net")
ZERO = Rec("/devices/virtual/mem/zero", "zero", "mem")
ODD = Rec("/devices/virtual/odd/t\\x", "t\\x", "odd", attrs={"name": "café\n".encode()})
CAFE = Rec(ODD.devpath + "/c", "c", "odd", parent=ODD)

# Where udev's own engine answers other than a plain reading of its rules would, each a named
# case: (id, rule, device, udev's answer).
DIVERGENCES = [
    ("unreadable-attr-ne-is-false", 'SUBSYSTEM=="net", ATTR{carrier}!="0"', LINK_DOWN, False),
    ("unreadable-attr-ne-up-link", 'SUBSYSTEM=="net", ATTR{carrier}!="0"', LINK_UP, True),
    ("unreadable-attr-ne-no-carrier", 'SUBSYSTEM=="net", ATTR{carrier}!="0"', NO_CARRIER, False),
    ("unreadable-attr-eq-empty-is-false", 'ATTR{carrier}==""', LINK_DOWN, False),
    ("missing-attr-eq-empty-is-false", 'ATTR{nope}==""', NULL, False),
    ("missing-attrs-ne-on-parents-is-false", 'ATTRS{nope}!="x"', TTY, False),
    ("attrs-ne-holds-where-readable", 'ATTRS{idVendor}!="1d6b"', TTY, True),
    ("missing-env-eq-empty-stays-true", 'ENV{NOPE}==""', TTY, True),
    ("missing-env-ne-stays-true", 'ENV{NOPE}!="x"', TTY, True),
    ("missing-driver-eq-empty-stays-true", 'DRIVER==""', NULL, True),
    ("plain-value-keeps-backslash", 'KERNEL=="ze\\ro"', ZERO, False),
    ("plain-value-backslash-literal", 'KERNEL=="t\\x"', ODD, True),
    ("glob-backslash-escapes", 'KERNEL=="ze\\r*"', ZERO, True),
    ("glob-trailing-backslash-never-matches", 'KERNEL==e"t*\\\\"', ODD, False),
    ("bar-splits-even-escaped", 'KERNEL=="null\\|zero"', ZERO, True),
    ("bar-splits-even-escaped-left", 'KERNEL=="null\\|zero"', NULL, False),
    ("glob-alternative-ending-in-backslash", 'KERNEL=="nu*\\|zero"', NULL, False),
    ("empty-alternative-matches-empty", 'ENV{NOPE}=="x|"', TTY, True),
    ("empty-alternative-leading", 'DRIVER=="|ftdi_sio"', TTY, True),
    ("double-bar-empty-alternative", 'KERNEL=="zero||null"', NULL, True),
    ("subsystem-bus-alias", 'SUBSYSTEM=="bus"', Rec("/bus/usb", "usb", "subsystem"), True),
    ("subsystem-class-alias-ne", 'SUBSYSTEM!="class"', NULL, True),
    ("glob-question-mark-is-one-byte", 'ATTR{name}=="caf?"', ODD, False),
    ("glob-two-bytes-of-utf8", 'ATTR{name}=="caf??"', ODD, True),
    ("plain-utf8-compares-whole", 'ATTR{name}=="café"', ODD, True),
    ("e-string-escape", 'KERNEL==e"\\x7aero"', ZERO, True),
    ("e-string-backslash-pair", 'KERNEL==e"t\\\\x"', ODD, True),
    ("spaces-around-operator", 'KERNEL == "zero"', ZERO, True),
    ("clauses-without-comma", 'SUBSYSTEM=="mem" KERNEL=="zero"', ZERO, True),
    ("tag-eq-any-is-tag-ne-empty", 'TAG=="?*"', NULL, True),  # no tag is empty: true
    ("tag-ne-any-is-tag-eq-empty", 'TAG!="?*"', TTY, False),
    ("plural-keys-on-one-parent", 'KERNELS=="c", ATTRS{name}=="café"', CAFE, False),
    ("plural-keys-on-one-parent-hold", 'KERNELS=="t*", ATTRS{name}=="café"', CAFE, True),
]


@pytest.mark.parametrize(("rule", "device", "expected"), [d[1:] for d in DIVERGENCES],
                         ids=[d[0] for d in DIVERGENCES])
def test_a_known_divergence_matches_as_udev(rule: str, device: Rec, expected: bool) -> None:
    assert matches(parse_rule(rule), device) is expected
