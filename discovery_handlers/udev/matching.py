"""Decide whether a device matches a rule, the way udev evaluates match keys. Pure: the device
is a ``DeviceView`` (the libudev wrapper gives real ones; unit tests give plain records).

Why this exists: rule semantics are the part users reason about, so they live apart from
libudev and are tested over tables. udev's reading, which this follows:

- a missing attribute, property or driver reads as the empty string (``ENV{X}==""`` matches a
  device without ``X``, and ``ATTR{x}!="1"`` matches one without ``x``);
- sysfs attribute values lose trailing whitespace unless the pattern itself ends in whitespace;
- singular keys test the device itself; the plural keys (``ATTRS``, ``DRIVERS``, ``KERNELS``,
  ``SUBSYSTEMS``, ``TAGS``) search the device and then its parents for ONE device on which every
  plural clause of the rule holds (``!=`` clauses included, tested on that same device);
- ``TAG`` matches when any of the device's tags matches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from discovery_handlers.udev.rules import Key, Match, Rule

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
    found = _test(match, device)
    return not found if match.negate else found


def _test(match: Match, device: DeviceView) -> bool:
    key = match.key
    pattern = match.pattern
    if key in (Key.TAG, Key.TAGS):
        return any(pattern.matches(tag) for tag in device.tags)
    if key in (Key.ATTR, Key.ATTRS):
        assert match.name is not None
        raw = device.attribute(match.name)
        return pattern.matches(attribute_text(raw, keep_trailing=_ends_in_space(pattern.source)))
    if key is Key.ENV:
        assert match.name is not None
        return pattern.matches(device.property(match.name) or "")
    value: str | None
    if key is Key.DEVPATH:
        value = device.devpath
    elif key in (Key.KERNEL, Key.KERNELS):
        value = device.kernel
    elif key in (Key.SUBSYSTEM, Key.SUBSYSTEMS):
        value = device.subsystem
    else:  # DRIVER, DRIVERS
        value = device.driver
    return pattern.matches(value or "")


def attribute_text(raw: bytes | None, *, keep_trailing: bool = False) -> str:
    """A sysfs attribute's bytes as matching sees them: undecodable bytes stay distinct (they
    match only ``*``/``?``), trailing whitespace dropped unless asked to keep it."""
    if raw is None:
        return ""
    text = raw.decode("utf-8", errors="surrogateescape")
    return text if keep_trailing else text.rstrip()


def _ends_in_space(source: str) -> bool:
    return bool(source) and source[-1].isspace()
