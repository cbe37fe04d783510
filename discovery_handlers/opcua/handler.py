"""The contract adapter of the ``opcua`` handler: parse details, stream device lists.

Parsing never imports asyncua; discovery imports it on first use, so an agent that runs no OPC-UA
Configuration never pays for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from discovery_handlers.contract import Device, PropertyValue
from discovery_handlers.opcua.details import OpcuaDetails, parse_details

NAME = "opcua"


class OpcuaHandler:
    """OPC-UA servers are shared: every node that reaches one may serve it."""

    name = NAME
    shared = True

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> OpcuaDetails:
        return parse_details(details, properties)

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        if not isinstance(details, OpcuaDetails):
            raise TypeError(f"opcua.discover needs OpcuaDetails, got {type(details).__name__}")
        from discovery_handlers.opcua.monitor import Monitor  # imports asyncua (~40 MiB)

        # closing this generator (the CLI's aclosing, the agent's cancel) ends the monitor's tasks
        async with contextlib.aclosing(Monitor(details).lists()) as lists:
            async for devices in lists:
                yield devices


handler = OpcuaHandler()
