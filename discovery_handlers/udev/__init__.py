"""``udev``: discover local devices by udev rules, as Akri's udev handler does, event-driven.

The contract adapter (``handler``: ``parse_details``, ``discover``); pyudev is imported only when
discovery starts. The parts and why they are split so: docs/handlers/udev.md, "Inside the handler".
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
