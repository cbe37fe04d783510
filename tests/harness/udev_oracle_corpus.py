"""The rules the udev oracle test runs through udev's engine and through ``edgeplug discover``.

Agreement with udev is only as good as the rules tried. The corpus is every
rule example in docs/handlers/udev.md and in crds/examples/udev*.yaml (read from those files, so
a new example joins by itself), Akri's documented examples (its udev discovery handler page and
the rules its tests parse, test/example.rules, copied as facts: the rule strings), and the
grammar's corners: attributes that are missing or cannot be read, globs, classes, ``|``,
escapes, plural keys on one ancestor, whitespace, commas, ``e"..."`` strings. Corners name
devices of the test's two trees: this machine's /sys in a private network namespace (``lo`` up,
a veth pair ``v0`` up without carrier and ``v1`` down) and the umockdev bed's FTDI radios.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "handlers" / "udev.md"
EXAMPLES = sorted((REPO / "crds" / "examples").glob("udev*.yaml"))

#: Rule examples the docs show on purpose although edgeplug refuses them (each with the
#: reason in docs/handlers/udev.md, "Where we differ from udev"); the oracle skips them and
#: test_udev_oracle checks that edgeplug does refuse them.
DELIBERATE = {
    'ATTR{$attr}=="x"': "udev substitutes % and $ in attribute names per event",
    'ATTRS{[usb/1-1]serial}=="x"': "reads another device's attribute",
    'KERNEL=="[[:bogus:]]"': "an unknown class never matches in udev: a typo",
    'ACTION=="add"': "discovery enumerates: there is no event action",
    'NAME=="eth0"': "NAME is what rules assign",
    "": "an empty rule",
}

#: Akri's udev discovery handler page (docs.akri.sh/discovery-handlers/udev) and the rules
#: Akri's parser tests read (project-akri/akri test/example.rules).
AKRI = [
    'SUBSYSTEM=="sound", ATTR{vendor}=="Great Vendor"',
    'SUBSYSTEM=="sound", ATTR{vendor}=="Awesome Vendor"',
    'SUBSYSTEM=="sound", KERNEL=="card[0-9]*"',
    'SUBSYSTEM=="video4linux"',
    'KERNEL=="video*", ENV{ID_SERIAL}=="?*"',
    'ENV{ID_PATH}=="?*", KERNEL=="video*|vbi*", DRIVER=="some driver"',
    'TAG=="uaccess",ENV{MAJOR}!=""',
    'KERNEL=="video[0-9]", DEVPATH!="/sys/path/to/device"',
    'ATTR{idProduct}=="1900", ENV{ID_MM_ERICSSON_MBM}=="1"',
    'ATTR{idVendor}=="0bdd", ENV{a name}=="Keyboard that has a mouse"',
    'KERNEL=="video[0-9]*", ENV{ID_V4L_CAPABILITIES}==":capture:"',
    'SUBSYSTEMS=="pci"',
    'ATTRS{idVendor}=="0bdd", DRIVERS!="a driver"',
    'TAGS=="uaccess"',
    'KERNELS=="card[0-9]*"',
]

CORNERS = [
    # attributes that cannot be read: missing, unreadable (carrier of a down link: EINVAL),
    # write-only, a directory; false for == and != alike
    'SUBSYSTEM=="net", ATTR{carrier}!="0"',
    'SUBSYSTEM=="net", ATTR{carrier}=="0"',
    'SUBSYSTEM=="net", ATTR{carrier}==""',
    'SUBSYSTEM=="net", ATTR{carrier}=="?*"',
    'SUBSYSTEM=="net", ATTR{carrier}!=""',
    'SUBSYSTEM=="net", ATTR{queues}!="x"',
    'SUBSYSTEM=="net", ATTR{subsystem}=="net"',
    'SUBSYSTEM=="pci", ATTR{remove}!="x"',
    'KERNEL=="null", ATTR{nope}!="x"',
    'KERNEL=="null", ATTR{nope}==""',
    'KERNEL=="ttyS0", ATTRS{nope}!="x"',
    'SUBSYSTEM=="block", ATTRS{vendor}!="0x8086"',
    'SUBSYSTEM=="tty", ATTRS{idVendor}!="0403"',
    'KERNEL=="null", ENV{NOPE}==""',
    'KERNEL=="null", ENV{NOPE}!="x"',
    'KERNEL=="null", DRIVER==""',
    'SUBSYSTEM=="mem", DRIVER!="x"',
    # trailing whitespace: stripped unless the pattern ends in some
    'KERNEL=="null", ATTR{dev}=="1:3"',
    'KERNEL=="null", ATTR{dev}=="1:3 "',
    # globs and classes
    'KERNEL=="tty[0-9]"',
    'KERNEL=="tty[!0-9]*"',
    'KERNEL=="tty[^a-z]?"',
    'KERNEL=="tty[[:digit:]][[:digit:]]"',
    'KERNEL=="loop[0-3]"',
    'KERNEL=="ttyS?"',
    'KERNEL=="[nz]*"',
    'KERNEL=="[z-a]*"',
    'KERNEL=="tty[a"',
    'DEVPATH=="/devices/virtual/mem/*"',
    'DEVPATH=="*/net/*"',
    'ENV{DEVNAME}=="/dev/tty[0-9]"',
    # alternatives: every | splits, empty ones match the empty string
    'KERNEL=="null|zero"',
    'KERNEL=="null|"',
    'SUBSYSTEM=="mem", DRIVER=="|x"',
    'KERNEL=="null||zero"',
    'SUBSYSTEM=="mem", KERNEL=="null\\|zero"',
    'KERNEL=="nu*\\|zero"',
    'KERNEL=="ttyUSB*|ttyACM*"',
    # escapes: a plain value keeps its backslash, a glob's escapes the next character
    'KERNEL=="n\\ull"',
    'KERNEL=="n\\u*"',
    'KERNEL=="n\\*"',
    'ATTR{x}=="say \\"hi\\""',
    # e"..." strings
    'KERNEL==e"nu\\x6cl"',
    'KERNEL==e"zer\\157"',
    'KERNEL==e"n\\\\u*"',
    'KERNEL==e"null\\s"',
    'KERNEL==e"nu*\\\\"',
    'KERNEL==e"\\q"',
    # whitespace and commas, as udev reads a rules line
    'KERNEL == "random"',
    'KERNEL =="random" , SUBSYSTEM== "mem"',
    'KERNEL=="random"SUBSYSTEM=="mem"',
    'KERNEL=="random" SUBSYSTEM=="mem"',
    'SUBSYSTEM=="mem",,KERNEL=="zero",',
    ', KERNEL=="full"',
    '\tKERNEL=="null"\t',
    'ATTR{dev} == "1:3"',
    'ATTR {dev}=="1:3"',
    'KERNEL{x}=="null"',
    'KERNEL="null"',
    'FOO=="bar"',
    'KERNEL==i"NULL"',
    'ENV{}=="x"',
    # plural keys: all on one device of the chain
    'SUBSYSTEMS=="pci", ATTRS{vendor}=="0x1af4"',
    'SUBSYSTEMS=="pci", DRIVERS=="virtio*"',
    'KERNELS=="virtio*", SUBSYSTEMS!="virtio"',
    'KERNELS=="virtio*", SUBSYSTEMS=="virtio"',
    'SUBSYSTEM=="block", KERNELS=="0000:*", DRIVERS!="virtio-pci"',
    'KERNEL=="ttyS0", ATTRS{driver}=="serial8250"',
    'SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{bInterfaceNumber}=="00"',
    'SUBSYSTEM=="tty", KERNELS=="1-1", SUBSYSTEMS!="usb-serial"',
    'SUBSYSTEM=="tty", KERNELS=="1-1:1.0", ATTRS{bInterfaceNumber}=="00"',
    'SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{serial}=="HUB*"',
    # the umockdev bed's odd attributes: UTF-8 and bytes that are not UTF-8
    'ATTRS{product}=="caf?"',
    'ATTRS{product}=="caf??"',
    'ATTRS{product}=="café"',
    'ATTRS{product}=="caf[!a-z]*"',
    'ATTRS{blob}=="A?B"',
    'ATTRS{blob}=="A*"',
    'ATTRS{blob}=="A[[:print:]]B"',
    'ENV{ID_SERIAL_SHORT}=="A5*", SUBSYSTEM=="tty"',
    'ATTRS{pad}=="x"',
    'ATTRS{pad}=="x "',
    'ATTRS{pad}==e"x \\t"',
    'ATTRS{pad}=="x*"',
    'ATTRS{vtab}=="y"',
    'ATTRS{vtab}=="y?"',
    'SUBSYSTEM=="tty", KERNEL=="tty??0"',
    'KERNEL=="tty??0"',
    'KERNEL=="tty?0", SUBSYSTEM=="tty"',
    'KERNEL=="ttyé0"',
    # subsystem aliases, tags (none in a namespace without udev's database)
    'SUBSYSTEM=="bus"',
    'SUBSYSTEM!="class", KERNEL=="null"',
    'TAG!="seat", KERNEL=="zero"',
    'TAGS=="seat"',
    'TAG=="seat"',
    'TAG=="uacc*"',
    'TAG!="uaccess", SUBSYSTEM=="mem"',
    'TAG=="seat", TAG!="uaccess"',
    'TAG=="seat|systemd"',
    'TAGS=="systemd", SUBSYSTEM=="net"',
    'TAG=="?*", KERNEL=="null"',
    'TAGS=="?*", KERNEL=="null"',
    'TAG!="?*", KERNEL=="null"',
    'KERNEL=="null", ATTR{nope}!="?*"',
]


def doc_rules(text: str) -> list[str]:
    """Rule examples in a Markdown page: ``udevRules`` items in YAML blocks and inline code
    spans that read as rules (``KEY==`` or ``KEY!=`` followed by a quote)."""
    found: list[str] = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL):
        found += _yaml_rules(block)
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.match(r"\s*,?\s*[A-Z]+(\{[^}]*\})?\s*[!=]=\s*e?\"", span):
            found.append(span)
    return found


def _yaml_rules(block: str) -> list[str]:
    try:
        loaded = yaml.safe_load(block)
    except yaml.YAMLError:
        return []
    rules: list[str] = []
    stack = [loaded]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("udevRules"), list):
                rules += [r for r in node["udevRules"] if isinstance(r, str)]
            details = node.get("discoveryDetails")
            if isinstance(details, str):
                stack.append(yaml.safe_load(details))
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return rules


def corpus() -> list[tuple[str, str]]:
    """(source, rule) for every rule, without repeats, deliberate exceptions left out."""
    entries = [("docs", r) for r in doc_rules(DOCS.read_text(encoding="utf-8"))]
    for path in EXAMPLES:
        entries += [(f"example {path.name}", r) for r in _yaml_rules(path.read_text())]
    entries += [("akri", r) for r in AKRI] + [("corner", r) for r in CORNERS]
    seen: set[str] = set()
    unique = []
    for source, rule in entries:
        if rule not in seen and rule not in DELIBERATE:
            seen.add(rule)
            unique.append((source, rule))
    return unique
