"""``udev``: discover local devices by udev rules, as Akri's udev handler does, event-driven.

Why this exists: the commonest edge case is a device node on one node (a USB-to-serial radio,
a camera) that exactly one broker pod may open. This package is the contract adapter; the
parts are ``rules``/``patterns`` (rule text → matchers), ``matching`` (udev's semantics),
``details`` (discoveryDetails), ``devices`` (ids, grouping, properties) — all pure — and
``udevlib`` (the seam over pyudev) with ``watch`` (the event loop). pyudev is imported only
when discovery starts, never by ``parse_details``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from discovery_handlers.contract import Device, PropertyValue
from discovery_handlers.udev.details import UdevDetails, parse_details

NAME = "udev"


class UdevHandler:
    """The udev handler; ``handler`` below is the entry point's object. Devices are local."""

    name = NAME
    shared = False

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> UdevDetails:
        del properties  # udev discovery takes no discovery properties
        return parse_details(details)

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        if not isinstance(details, UdevDetails):
            raise TypeError(f"udev discover() needs UdevDetails, got {type(details).__name__}")
        from discovery_handlers.udev.watch import Watcher  # imports pyudev

        async for devices in Watcher(details).changes():
            yield devices


handler = UdevHandler()
