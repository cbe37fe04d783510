"""Parse a udev Configuration's ``discoveryDetails`` (Akri's fields plus a ``usb`` shorthand).

``parse_details`` returns the rules to match, or refuses with a message naming the field. It
imports no pyudev (the webhook and ``edgeplug discover`` call it too). Fields:
docs/handlers/udev.md, "Configuration".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from discovery_handlers.contract import InvalidDetails
from discovery_handlers.udev.patterns import compile_pattern, literal_pattern
from discovery_handlers.udev.rules import Key, Match, Rule, RuleError, parse_rule
from discovery_handlers.yaml_details import load_mapping

PERMISSIONS = ("r", "w", "m", "rw", "rm", "wm", "rwm")
DEFAULT_PERMISSIONS = "rwm"
MAX_RULES = 256
_KNOWN_FIELDS = ("udevRules", "groupRecursive", "permissions", "usb")
_USB_FIELDS = ("vendor", "product", "serial", "interface")
#: The ``usb`` shorthand's devices are one per USB interface (id: the interface's DEVPATH).
USB_ANCHOR = "usb_interface"
_USB_ID = re.compile(r"[0-9a-fA-F]{4}")


@dataclass(frozen=True)
class UdevDetails:
    """Parsed details: the compiled rules (``usb`` included) and Akri's two options."""

    rules: tuple[Rule, ...]
    group_recursive: bool = False
    permissions: str = DEFAULT_PERMISSIONS
    shared: bool = False


def parse_details(details: str | bytes) -> UdevDetails:
    """Validate ``discoveryDetails`` YAML; raise ``InvalidDetails`` naming the field."""
    raw = _load_yaml(details)
    unknown = sorted(str(k) for k in raw if k not in _KNOWN_FIELDS)
    if unknown:
        raise InvalidDetails(unknown[0], f"unknown field (known: {', '.join(_KNOWN_FIELDS)})")
    rules = list(_parse_rules(raw.get("udevRules")))
    usb = raw.get("usb")
    if usb is not None:
        rules.append(usb_rule(usb))
    if not rules:
        raise InvalidDetails("udevRules", "required: a non-empty list of udev rule strings "
                             "(or a usb: {vendor, product} selection)")
    group = raw.get("groupRecursive", False)
    if not isinstance(group, bool):
        raise InvalidDetails("groupRecursive", "must be true or false")
    permissions = raw.get("permissions", DEFAULT_PERMISSIONS)
    if permissions not in PERMISSIONS:
        raise InvalidDetails("permissions", f"must be one of {' '.join(PERMISSIONS)}, "
                             f"got {permissions!r}")
    return UdevDetails(rules=tuple(rules), group_recursive=group, permissions=permissions)


def _load_yaml(details: str | bytes) -> dict[Any, Any]:
    if isinstance(details, bytes):
        try:
            details = details.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidDetails("(root)", f"not UTF-8 text (byte {exc.start})") from None
    if not details.strip():
        raise InvalidDetails("udevRules", "required: a non-empty list of udev rule strings")
    return load_mapping(details, expected="must be a mapping with udevRules")


def _parse_rules(value: Any) -> list[Rule]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidDetails("udevRules", "must be a list of rule strings")
    if len(value) > MAX_RULES:
        raise InvalidDetails("udevRules", f"at most {MAX_RULES} rules")
    rules: list[Rule] = []
    for index, text in enumerate(value):
        field = f"udevRules[{index}]"
        if not isinstance(text, str):
            raise InvalidDetails(field, f"must be a string, got {type(text).__name__} "
                                 '(quote the rule: - \'KERNEL=="ttyUSB0"\')')
        bad = _first_unencodable(text)
        if bad is not None:
            raise InvalidDetails(field, f"at position {bad + 1}: not UTF-8 text")
        try:
            rules.append(parse_rule(text))
        except RuleError as exc:
            raise InvalidDetails(field, str(exc)) from None
    return rules


def _first_unencodable(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def usb_rule(value: Any) -> Rule:
    """Compile ``usb: {vendor, product, serial?, interface?}``: the device nodes below that USB
    device (below that interface when given), the USB device's own node excluded; they form
    one device per USB interface, whose id is the interface's DEVPATH (stable per port)."""
    if not isinstance(value, dict):
        raise InvalidDetails("usb", "must be a mapping with vendor and product")
    unknown = sorted(str(k) for k in value if k not in _USB_FIELDS)
    if unknown:
        raise InvalidDetails(f"usb.{unknown[0]}",
                             f"unknown field (known: {', '.join(_USB_FIELDS)})")
    device = [_literal(Key.SUBSYSTEMS, None, "usb")]
    for field, attr in (("vendor", "idVendor"), ("product", "idProduct")):
        text = _usb_id(value.get(field), f"usb.{field}")
        device.append(_literal(Key.ATTRS, attr, text.lower()))
    serial = value.get("serial")
    if serial is not None:
        if not isinstance(serial, str) or not serial or _first_unencodable(serial) is not None:
            raise InvalidDetails("usb.serial", "must be a non-empty string")
        device.append(_literal(Key.ATTRS, "serial", serial))
    groups = [tuple(device)]
    interface = value.get("interface")
    if interface is not None:
        if (isinstance(interface, bool) or not isinstance(interface, int)
                or not 0 <= interface <= 255):
            raise InvalidDetails("usb.interface", "must be an interface number 0-255")
        groups.append((_literal(Key.SUBSYSTEMS, None, "usb"),
                       _literal(Key.ATTRS, "bInterfaceNumber", f"{interface:02x}")))
    own = (
        Match(key=Key.SUBSYSTEM, name=None, negate=True, pattern=compile_pattern("usb")),
        Match(key=Key.ENV, name="DEVNAME", negate=False, pattern=compile_pattern("?*")),
    )
    return Rule(own=own, parent_groups=tuple(groups), anchor=USB_ANCHOR)


def _usb_id(value: Any, field: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        raise InvalidDetails(field, "must be a quoted string of 4 hex digits, e.g. \"0403\" "
                             "(YAML reads an unquoted 0403 as a number)")
    if not isinstance(value, str) or _USB_ID.fullmatch(value) is None:
        raise InvalidDetails(field, "required: 4 hex digits, e.g. \"0403\"")
    return value


def _literal(key: Key, name: str | None, value: str) -> Match:
    return Match(key=key, name=name, negate=False, pattern=literal_pattern(value))
