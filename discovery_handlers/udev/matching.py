"""Decide whether a device matches a rule, the way udev evaluates match keys. Pure: the device is a
``DeviceView`` (the libudev seam gives real ones; unit tests give plain records).

udev's reading, which this follows: docs/handlers/udev.md, "Rules".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from discovery_handlers.udev.rules import Key, Match, Rule

#: What udev strips from an attribute's end (systemd's WHITESPACE), and C's isspace().
_TRAILING = " \t\n\r"
_C_SPACE = " \t\n\v\f\r"
#: Parent chains are short (a USB tty is ~10 deep); a bound stops a corrupt or looping view.
MAX_PARENT_DEPTH = 64


class DeviceView(Protocol):
    """What matching reads of a device; every read may return None when the value is absent
    (or the device vanished meanwhile)."""

    @property
    def devpath(self) -> str: ...  # the kernel's DEVPATH: sysfs path without ``/sys``

    @property
    def kernel(self) -> str: ...  # sysname, e.g. ``ttyUSB0``

    @property
    def subsystem(self) -> str | None: ...

    @property
    def driver(self) -> str | None: ...

    @property
    def tags(self) -> frozenset[str]: ...

    @property
    def parent(self) -> DeviceView | None: ...

    def attribute(self, name: str) -> bytes | None: ...

    def property(self, name: str) -> str | None: ...


def matches(rule: Rule, device: DeviceView) -> bool:
    """True when ``device`` satisfies every clause of ``rule``."""
    if not all(_holds(m, device) for m in rule.own):
        return False
    return all(
        any(all(_holds(m, d) for m in group) for d in chain(device))
        for group in rule.parent_groups
    )


def first_match(rules: tuple[Rule, ...], device: DeviceView) -> Rule | None:
    """The first rule ``device`` matches, None when none does."""
    return next((rule for rule in rules if matches(rule, device)), None)


def chain(device: DeviceView) -> Iterator[DeviceView]:
    """The device, then its parents up to the root (bounded)."""
    current: DeviceView | None = device
    depth = 0
    while current is not None and depth < MAX_PARENT_DEPTH:
        yield current
        current = current.parent
        depth += 1


def _holds(match: Match, device: DeviceView) -> bool:
    if match.key in (Key.TAG, Key.TAGS):
        found = any(match.pattern.matches(tag) for tag in device.tags)
    else:
        value = _value(match, device)
        if value is None:
            return False  # an attribute that cannot be read: false for == and != (udev)
        found = match.pattern.matches(value)
    return found != match.negate


def _value(match: Match, device: DeviceView) -> str | None:
    """The value a clause compares; None only for an attribute that cannot be read."""
    key = match.key
    if key in (Key.ATTR, Key.ATTRS):
        assert match.name is not None
        raw = device.attribute(match.name)
        if raw is None:
            return None
        return attribute_text(raw, keep_trailing=_ends_in_space(match.pattern.source))
    if key is Key.ENV:
        assert match.name is not None
        return device.property(match.name) or ""
    if key is Key.DEVPATH:
        return device.devpath
    if key in (Key.KERNEL, Key.KERNELS):
        return device.kernel
    if key in (Key.SUBSYSTEM, Key.SUBSYSTEMS):
        return device.subsystem or ""
    return device.driver or ""  # DRIVER, DRIVERS


def attribute_text(raw: bytes, *, keep_trailing: bool = False) -> str:
    """A sysfs attribute's bytes as matching sees them: undecodable bytes stay distinct (they
    match only wildcards), trailing whitespace dropped unless asked to keep it."""
    text = raw.decode("utf-8", errors="surrogateescape")
    return text if keep_trailing else text.rstrip(_TRAILING)


def _ends_in_space(source: str) -> bool:
    return bool(source) and source[-1] in _C_SPACE
