"""A name served by a registered out-of-process handler: the contract adapter.

Why this exists: Akri runs every discovery handler (its own and its users') as a process that
registers with the agent over gRPC. ``ExternalHandler`` is what a discovery run of such a name
runs: while a handler is registered under the name it streams that handler's lists; while none
is, it serves the built-in of that name (Akri's handler names ``debugEcho``, ``udev``, ``onvif``
and ``opcua`` are built-ins here too) or, for a name with no built-in, says it waits for a
registration. So an Akri user's handler DaemonSet takes its name over on its node, as in Akri.

A handler that breaks its stream or whose endpoint vanishes is dialled again with bounded
backoff; meanwhile its devices are reported gone (an empty list), so their Instances follow the
offline-grace rules, and they come back under the same names when it does. A handler away for
longer than ``grace`` loses its registration, and the built-in (if any) serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from discovery_handlers.contract import (
    Device,
    DeviceList,
    DiscoveryHandler,
    InvalidDetails,
    PropertyValue,
    is_shared,
    warnings_of,
)
from discovery_handlers.external import stream
from discovery_handlers.external.registrations import Registration, Registrations
from discovery_handlers.external.status import HandlerStatus
from discovery_handlers.registry import known_handler_names

log = logging.getLogger(__name__)

#: Akri's own handler names: a registration under one of them takes the built-in's place.
AKRI_HANDLER_NAMES = frozenset({"debugEcho", "udev", "onvif", "opcua"})
#: Seconds before dialling a lost handler again: doubling from the base, never above the max.
RETRY_BASE = 0.25
RETRY_MAX = 10.0
#: Seconds a registered handler may stay unreachable before its registration is dropped
#: (Akri's default offline grace); the agent's settings override it.
DEFAULT_GRACE = 300.0

_T = TypeVar("_T")


class SharingChanged(RuntimeError):
    """The side now serving a name shares devices differently from the one the run started
    with: Instance names depend on it, so the run starts again (the agent restarts it)."""


@dataclass
class ExternalDetails:
    """A run's details: as written (the external handler parses them itself), the resolved
    properties, and the built-in's parse of them where the name has a built-in. ``shared``
    follows whichever side serves now (a registration's flag, or the built-in's choice)."""

    raw: str
    properties: Mapping[str, PropertyValue] = field(repr=False)
    builtin: Any = None
    builtin_error: InvalidDetails | None = None
    shared: bool = True


class ExternalHandler:
    """The handler a discovery run gets for ``name`` while the agent hosts registrations."""

    def __init__(
        self, *, name: str, registrations: Registrations, builtin: DiscoveryHandler | None,
        grace: float, waiting_on: str,
    ) -> None:
        self.name = name
        self.shared = builtin.shared if builtin is not None else True
        self._registrations = registrations
        self._builtin = builtin
        self._grace = grace
        self._waiting_on = waiting_on
        self._taken_over = False

    def parse_details(
        self, details: str, properties: Mapping[str, PropertyValue]
    ) -> ExternalDetails:
        parsed = ExternalDetails(raw=details, properties=dict(properties))
        registration = self._registrations.get(self.name)
        if self._builtin is not None:
            try:
                parsed.builtin = self._builtin.parse_details(details, properties)
                parsed.shared = is_shared(self._builtin, parsed.builtin)
            except InvalidDetails as exc:
                if registration is None:
                    raise  # nothing else could make sense of them
                parsed.builtin_error = exc
        if registration is not None:
            parsed.shared = registration.shared
        return parsed

    async def discover(self, details: Any) -> AsyncGenerator[Sequence[Device], None]:
        assert isinstance(details, ExternalDetails)
        served_external = False
        while True:
            changed = self._registrations.changed(self.name)
            registration = self._registrations.get(self.name)
            if registration is not None:
                _check_sharing(details, registration.shared, f"handler registered at "
                               f"{registration.endpoint}")
                self._note_takeover(registration)
                served_external = True
                async with contextlib.aclosing(
                    self._serve_registered(registration, details)
                ) as served:
                    async for devices in served:
                        yield self._noting_takeover(devices, registration)
                continue
            if self._builtin is None:
                yield HandlerStatus([], ready=False, message=(
                    f"discovery handler {self.name!r} is not registered on this node: "
                    f"waiting for it to register on {self._waiting_on} (installed handlers: "
                    f"{', '.join(known_handler_names()) or 'none'})"
                ))
                await changed.wait()
                continue
            self._note_builtin()
            if details.builtin_error is not None:
                raise details.builtin_error
            _check_sharing(details, is_shared(self._builtin, details.builtin),
                           "built-in handler")
            announce = served_external
            builtin = _until(self._builtin.discover(details.builtin), changed)
            async with contextlib.aclosing(builtin):
                async for devices in builtin:
                    if announce:
                        announce = False
                        yield HandlerStatus(devices, warnings_of(devices), ready=True, message=(
                            f"built-in handler {self.name!r} serves again (no handler "
                            "registered under its name)"
                        ))
                    else:
                        yield devices

    async def _serve_registered(
        self, registration: Registration, details: ExternalDetails
    ) -> AsyncGenerator[Sequence[Device], None]:
        """Stream ``registration``'s lists, dialling again after a loss, until it is replaced
        or dropped (away for longer than the grace)."""
        where = f"{registration.name!r} at {registration.endpoint}"
        loop = asyncio.get_running_loop()
        failures = 0
        lost_at: float | None = None
        announce = True
        while self._registrations.get(self.name) == registration:
            changed = self._registrations.changed(self.name)
            again = self._registrations.registered_again(self.name)
            unreachable = True
            try:
                lists = _until(
                    stream.discover(registration, details.raw, details.properties), changed
                )
                async with contextlib.aclosing(lists):
                    async for devices in lists:
                        failures, lost_at = 0, None
                        if announce:
                            announce = False
                            yield HandlerStatus(devices, ready=True, message=(
                                f"served by discovery handler {where} "
                                f"({registration.endpoint_type.name}, "
                                f"{'shared' if registration.shared else 'local'} devices)"
                            ))
                        else:
                            yield devices
                problem = "it ended its stream"
            except stream.HandlerUnreachable as exc:
                problem = str(exc)
            except stream.HandlerFailed as exc:  # it is there, and said why it cannot serve
                problem, unreachable = str(exc), False
            if changed.is_set():
                return  # another endpoint registered, or dropped: the caller looks again
            now = loop.time()
            if not unreachable:
                lost_at = None  # it answered, so it is not lost
            elif lost_at is None:
                lost_at = now
            away = 0.0 if lost_at is None else now - lost_at
            if away >= self._grace:
                if self._registrations.drop(registration):
                    log.warning(
                        "discovery handler %s unreachable for %.0fs (grace %.0fs): "
                        "registration dropped", where, away, self._grace,
                        extra={"handler": self.name},
                    )
                return
            failures += 1
            if failures == 1:
                state = "is unreachable" if unreachable else "failed"
                log.warning("discovery handler %s %s (%s); its devices are offline, "
                            "retrying", where, state, problem, extra={"handler": self.name})
                announce = True
                yield HandlerStatus([], ready=False, message=(
                    f"discovery handler {where} {state} ({problem}); retrying"
                ))
            delay = min(RETRY_MAX, RETRY_BASE * 2 ** (failures - 1), self._grace - away)
            await _any_of(changed, again, within=delay)

    def _noting_takeover(
        self, devices: Sequence[Device], registration: Registration
    ) -> Sequence[Device]:
        """While a registered handler stands in for the built-in, every list says so (a
        discovery warning: posted once as an Event on the Configuration, logged when over)."""
        if self._builtin is None:
            return devices
        note = (f"discovery handler {self.name!r} registered at {registration.endpoint} serves "
                f"in place of the built-in {self.name!r} on this node")
        if isinstance(devices, HandlerStatus):
            return HandlerStatus(devices, (*devices.warnings, note), ready=devices.ready,
                                 message=devices.message)
        return DeviceList(devices, (note,))

    def _note_takeover(self, registration: Registration) -> None:
        if self._builtin is not None and not self._taken_over:
            log.warning(
                "discovery handler %r registered at %s takes over the built-in %r on this node",
                self.name, registration.endpoint, self.name, extra={"handler": self.name},
            )
        self._taken_over = True

    def _note_builtin(self) -> None:
        if self._taken_over:
            log.warning("built-in discovery handler %r serves again on this node", self.name,
                        extra={"handler": self.name})
        self._taken_over = False


async def _any_of(*events: asyncio.Event, within: float) -> None:
    """Return once one of ``events`` is set, or after ``within`` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def _check_sharing(details: ExternalDetails, shared: bool, side: str) -> None:
    if shared != details.shared:
        raise SharingChanged(
            f"the {side} serves {'shared' if shared else 'local'} devices; restarting discovery"
        )


async def _until(items: AsyncIterator[_T], stop: asyncio.Event) -> AsyncGenerator[_T, None]:
    """Items of ``items`` until it ends or ``stop`` is set; ``items`` is closed either way."""
    stopper = asyncio.ensure_future(stop.wait())
    step: asyncio.Future[_T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(items))
            await asyncio.wait({step, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        pending = [f for f in (step, stopper) if f is not None]
        for future in pending:
            future.cancel()
        # Collected, whatever they ended with (a stream broken meanwhile included), so nothing
        # is left as "Task exception was never retrieved".
        await asyncio.gather(*pending, return_exceptions=True)
        closing = getattr(items, "aclose", None)
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing()


class ExternalHandlers:
    """The registry's resolver: which handler a run of a name gets while the agent hosts
    registrations. Names with no installed handler and Akri's handler names get an
    ``ExternalHandler``; other installed handlers (``ascend``, third parties) stay as they are.
    """

    def __init__(self, registrations: Registrations, *, grace: float, waiting_on: str) -> None:
        self.registrations = registrations
        self._grace = grace
        self._waiting_on = waiting_on
        self._handlers: dict[str, ExternalHandler] = {}

    def __call__(self, name: str, installed: DiscoveryHandler | None) -> DiscoveryHandler | None:
        if installed is not None and name not in AKRI_HANDLER_NAMES:
            return None
        handler = self._handlers.get(name)
        if handler is None:
            handler = self._handlers[name] = ExternalHandler(
                name=name, registrations=self.registrations, builtin=installed,
                grace=self._grace, waiting_on=self._waiting_on,
            )
        return handler
