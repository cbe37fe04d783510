"""A device list that also says how its handler stands, for the agent to report.

Why this exists: a run of a name served by an out-of-process handler can be waiting for that
handler to register, or have lost it, and the user should read why on the Configuration rather
than in the agent's log. ``discover`` yields the full list as always; where the state changed,
the list is a ``HandlerStatus`` carrying a verdict (ready or not) and a message. It is a
``DeviceList``, so it carries discovery warnings too (a handler standing in for a built-in says
so that way), and a run that does not know the type still sees an ordinary list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from discovery_handlers.contract import Device, DeviceList


class HandlerStatus(DeviceList):
    """The current devices, plus ``ready`` (False: a problem to report) and ``message``."""

    ready: bool
    message: str

    def __new__(
        cls, devices: Iterable[Device] = (), warnings: Iterable[str] = (), *,
        ready: bool = True, message: str = "",
    ) -> Self:
        listed = super().__new__(cls, devices, warnings)
        listed.ready = ready
        listed.message = message
        return listed
