"""A device list that also says how its handler stands, for the agent to report.

Why this exists: a run of a name served by an out-of-process handler can be waiting for that
handler to register, or have lost it, and the user should read why on the Configuration rather
than in the agent's log. ``discover`` yields the full list as always; where the state changed,
the list is a ``HandlerStatus`` carrying a verdict (ready or not) and a message. A run that does
not know the type still sees an ordinary list.
"""

from __future__ import annotations

from collections.abc import Iterable

from discovery_handlers.contract import Device


class HandlerStatus(list[Device]):
    """The current devices, plus ``ready`` (False: a problem to report) and ``message``."""

    def __init__(self, devices: Iterable[Device], *, ready: bool, message: str) -> None:
        super().__init__(devices)
        self.ready = ready
        self.message = message
