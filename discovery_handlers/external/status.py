"""A device list that also says how its handler stands, for the agent to report.

``HandlerStatus`` is a ``DeviceList`` with a verdict (ready or not) and a message, yielded where
the state changed; a run that does not know the type still sees an ordinary list.
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
