"""One run's list and verdict from the several endpoints of its name: pure, no I/O.

``devices`` merges the endpoints' lists (a device two report is listed once), ``verdict`` says
which serve and which failed, ``warnings`` what the Configuration should show
(docs/handlers/akri.md, "Several handlers of one name").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from discovery_handlers.contract import Device
from discovery_handlers.external.registrations import Registration
from discovery_handlers.external.retries import REFUSED, Failure


@dataclass
class Standing:
    """An endpoint as one run sees it: its current list (None: it has not answered, or it was
    lost since) and its last failure while it has no list."""

    registration: Registration
    devices: Sequence[Device] | None = None
    failure: Failure | None = None
    #: It serves devices of another sharing than the run's: its lists are left out.
    left_out: bool = False

    @property
    def where(self) -> str:
        return f"{self.registration.name!r} at {self.registration.endpoint}"

    @property
    def serving(self) -> bool:
        return self.devices is not None and not self.left_out


@dataclass(frozen=True)
class Verdict:
    """Whether the run is served, and the message saying by whom or what went wrong."""

    ready: bool
    message: str


def merged(lists: Iterable[Sequence[Device]]) -> list[Device]:
    """The devices of ``lists`` in order; a device (by id) in several lists is listed once, as
    the first list has it."""
    seen: set[str] = set()
    devices: list[Device] = []
    for listed in lists:
        for device in listed:
            if device.id not in seen:
                seen.add(device.id)
                devices.append(device)
    return devices


def devices(standings: Iterable[Standing]) -> list[Device]:
    """The run's list: the serving endpoints' lists merged, earliest registered first."""
    return merged(s.devices for s in standings if s.serving and s.devices is not None)


def verdict(standings: Sequence[Standing]) -> Verdict | None:
    """Ready while an endpoint serves; not ready where none does and one failed; None while
    nothing is known yet (no endpoint has answered or failed)."""
    serving = [s.registration for s in standings if s.serving]
    if serving:
        return Verdict(True, f"served by discovery handler {serving[0].name!r} at " + ", ".join(
            f"{r.endpoint} ({r.endpoint_type.name}, {'shared' if r.shared else 'local'} "
            "devices)" for r in serving))
    failed = [_failed(s) for s in standings if s.failure is not None]
    if failed:
        return Verdict(False, "; ".join(f"{text}; retrying" for text in failed))
    return None


def warnings(standings: Sequence[Standing], *, shared: bool) -> tuple[str, ...]:
    """While an endpoint serves, what the others' failures (and left-out lists) are: discovery
    warnings, as the verdict speaks only of the serving ones."""
    if not any(s.serving for s in standings):
        return ()
    notes: list[str] = []
    for standing in standings:
        if standing.left_out:
            kind = "shared" if standing.registration.shared else "local"
            notes.append(f"discovery handler {standing.where} serves {kind} devices, unlike "
                         f"the run's {'shared' if shared else 'local'} ones: its devices are "
                         "left out")
        elif standing.failure is not None and not standing.serving:
            notes.append(f"{_failed(standing)}; the other endpoints of its name serve")
    return tuple(notes)


def _failed(standing: Standing) -> str:
    assert standing.failure is not None
    state = "failed" if standing.failure.kind == REFUSED else "is unreachable"
    return f"discovery handler {standing.where} {state} ({standing.failure.problem})"
