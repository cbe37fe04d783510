"""What one discovery run of an Akri handler name gets from the built-in of that name.

``BuiltinServing`` holds the built-in's stream while it serves, its last list, the notes its
lists carry while it stands in for registered handlers that have not answered, and the one-time
"serves again" announcement. Behaviour: docs/handlers/akri.md, "Akri's handler names take over
the built-ins".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from discovery_handlers.contract import Device, DeviceList, warnings_of
from discovery_handlers.external import steps
from discovery_handlers.external.status import HandlerStatus


@dataclass
class BuiltinServing:
    """What one run gets from the built-in: its stream while it serves, its last list, the
    notes its lists carry while it stands in for handlers that have not answered, and whether
    its next list says that it serves again (``announce``: why)."""

    builtin: steps.Steps[Sequence[Device]] | None = None
    last: Sequence[Device] | None = None
    standing_in: tuple[str, ...] = ()
    announce: str | None = None
    #: A registered handler served the run since the built-in last did.
    served_external: bool = False

    def take(self) -> Sequence[Device]:
        """The built-in's finished read (``steps.Ended`` where it ended its stream)."""
        assert self.builtin is not None
        self.last = self.builtin.take()
        return self.last

    def note(self, notes: tuple[str, ...]) -> bool:
        """Set the stand-in notes; True where they changed."""
        changed = notes != self.standing_in
        self.standing_in = notes
        return changed

    def listed(self, devices: Sequence[Device], name: str) -> Sequence[Device]:
        """``devices`` as the run gets them: with the note, and the announcement once."""
        warnings = (*warnings_of(devices), *self.standing_in)
        if self.announce is not None:
            why, self.announce = self.announce, None
            return HandlerStatus(devices, warnings, ready=True,
                                 message=f"built-in handler {name!r} serves again ({why})")
        return DeviceList(devices, warnings) if self.standing_in else devices

    async def stop_builtin(self) -> None:
        builtin, self.builtin = self.builtin, None
        self.last, self.announce = None, None
        if builtin is not None:
            await builtin.close()
