"""The ``onvif`` handler's contract adapter: parse details, stream device lists.

Imports no vendor library at import time (``parse_details`` must work where onvif-zeep-async is
absent); the SOAP side is imported when discovery starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from discovery_handlers.contract import Device, PropertyValue
from discovery_handlers.onvif.details import OnvifDetails, parse_details

NAME = "onvif"


class OnvifHandler:
    """Network cameras found by ONVIF WS-Discovery; shared: every node on the network sees one."""

    name = NAME
    shared = True

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> OnvifDetails:
        return parse_details(details, properties)

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        if not isinstance(details, OnvifDetails):
            raise TypeError(f"onvif discovery needs OnvifDetails, not {type(details).__name__}")
        from discovery_handlers.onvif.scanner import Scanner  # imports the vendor library

        # aclosing: the scanner's sockets and HTTP connections are released when the agent stops
        # this stream, not whenever the garbage collector finalises it
        async with contextlib.aclosing(Scanner(details).devices()) as stream:
            async for devices in stream:
                yield devices
