"""A name served by a registered out-of-process handler: the contract adapter.

Why this exists: Akri runs every discovery handler (its own and its users') as a process that
registers with the agent over gRPC. ``ExternalHandler`` is what a discovery run of such a name
runs: while a handler is registered under the name it streams that handler's lists; while none
is, it serves the built-in of that name (Akri's handler names ``debugEcho``, ``udev``, ``onvif``
and ``opcua`` are built-ins here too) or, for a name with no built-in, says it waits for a
registration. So an Akri user's handler DaemonSet takes its name over on its node, as in Akri.

It takes it over once it has answered: a registered handler that has not yet answered a run's
``Discover`` (it refuses, it cannot be dialled) leaves the built-in serving that run, devices
and Instances as they were, and the run's lists carry a discovery warning saying why (this
node's ``DiscoveryHealthy`` condition on the Configuration, a Warning Event, one log line); it
is tried meanwhile with bounded backoff (``retries``). A run that serves nothing yet gives it
``HEAD_START`` to answer before the built-in serves meanwhile.

A handler that served, then breaks its stream or whose endpoint vanishes, is dialled again with
bounded backoff; meanwhile its devices are reported gone (an empty list), so their Instances
follow the offline-grace rules, and they come back under the same names when it does. A handler
away for longer than ``grace`` loses its registration, and the built-in (if any) serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from discovery_handlers.contract import (
    Device,
    DeviceList,
    DiscoveryHandler,
    InvalidDetails,
    PropertyValue,
    is_shared,
    warnings_of,
)
from discovery_handlers.external import retries, steps, stream
from discovery_handlers.external.registrations import Registration, Registrations
from discovery_handlers.external.status import HandlerStatus
from discovery_handlers.registry import known_handler_names

log = logging.getLogger(__name__)

#: Akri's own handler names: a registration under one of them takes the built-in's place.
AKRI_HANDLER_NAMES = frozenset({"debugEcho", "udev", "onvif", "opcua"})
#: Seconds a run serving nothing yet gives a registered handler that has not answered before the
#: built-in of its name serves meanwhile (a refusal or a failed dial starts the built-in at once).
HEAD_START = stream.CONNECT_TIMEOUT
#: Seconds a registered handler may stay unreachable before its registration is dropped
#: (Akri's default offline grace); the agent's settings override it.
DEFAULT_GRACE = 300.0


@dataclass
class _Serving:
    """What one run gets from the built-in: its stream while it serves, its last list, the note
    its lists carry while it stands in for a handler that has not answered, and whether its
    next list says that it serves again (``announce``: why)."""

    builtin: steps.Steps[Sequence[Device]] | None = None
    last: Sequence[Device] | None = None
    standing_in: str | None = None
    announce: str | None = None
    #: A registered handler served the run since the built-in last did.
    served_external: bool = False

    def take(self) -> Sequence[Device]:
        """The built-in's finished read (``steps.Ended`` where it ended its stream)."""
        assert self.builtin is not None
        self.last = self.builtin.take()
        return self.last

    def note(self, note: str | None) -> bool:
        """Set the stand-in note; True where it changed."""
        changed = note != self.standing_in
        self.standing_in = note
        return changed

    def listed(self, devices: Sequence[Device], name: str) -> Sequence[Device]:
        """``devices`` as the run gets them: with the note, and the announcement once."""
        warnings = warnings_of(devices)
        if self.standing_in is not None:
            warnings = (*warnings, self.standing_in)
        if self.announce is not None:
            why, self.announce = self.announce, None
            return HandlerStatus(devices, warnings, ready=True,
                                 message=f"built-in handler {name!r} serves again ({why})")
        return DeviceList(devices, warnings) if self.standing_in is not None else devices

    async def stop_builtin(self) -> None:
        builtin, self.builtin = self.builtin, None
        self.last, self.announce = None, None
        if builtin is not None:
            await builtin.close()


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
        #: The generation of the registration that last answered a Discover on this node.
        self._answered: int | None = None

    def parse_details(
        self, details: str, properties: Mapping[str, PropertyValue]
    ) -> ExternalDetails:
        parsed = ExternalDetails(raw=details, properties=dict(properties))
        registration = self._registrations.get(self.name)
        builtin_serves = False
        if self._builtin is not None:
            try:
                parsed.builtin = self._builtin.parse_details(details, properties)
                parsed.shared = is_shared(self._builtin, parsed.builtin)
                builtin_serves = True
            except InvalidDetails as exc:
                if registration is None:
                    raise  # nothing else could make sense of them
                parsed.builtin_error = exc
        # A registration that has not answered yet leaves the built-in serving (``_stand_in``).
        if registration is not None and not (
            builtin_serves and self._answered != registration.generation
        ):
            parsed.shared = registration.shared
        return parsed

    async def discover(self, details: Any) -> AsyncGenerator[Sequence[Device], None]:
        assert isinstance(details, ExternalDetails)
        serving = _Serving()
        try:
            while True:
                changed = self._registrations.changed(self.name)
                registration = self._registrations.get(self.name)
                if registration is None and self._builtin is None:
                    yield HandlerStatus([], ready=False, message=(
                        f"discovery handler {self.name!r} is not registered on this node: "
                        f"waiting for it to register on {self._waiting_on} (installed "
                        f"handlers: {', '.join(known_handler_names()) or 'none'})"
                    ))
                    await changed.wait()
                    continue
                if registration is None:
                    lists = self._serve_builtin(serving, details, changed)
                elif self._can_stand_in(details, registration):
                    lists = self._stand_in(serving, registration, details)
                else:
                    await serving.stop_builtin()
                    _check_sharing(details, registration.shared, f"handler registered at "
                                   f"{registration.endpoint}")
                    lists = self._take_over(serving, registration, details, None)
                async with contextlib.aclosing(lists):
                    async for devices in lists:
                        yield devices
        except steps.Ended:
            return  # the built-in ended its stream: nothing more will come
        finally:
            await serving.stop_builtin()

    def _can_stand_in(self, details: ExternalDetails, registration: Registration) -> bool:
        """Whether the built-in can serve the run while ``registration`` has not answered: it
        parsed the details and names Instances as the run does (after a handler of another
        sharing answered, the run restarted with its naming: the built-in's would differ)."""
        if self._builtin is None or details.builtin_error is not None:
            return False
        if is_shared(self._builtin, details.builtin) != details.shared:
            return False
        return not (self._answered == registration.generation
                    and registration.shared != details.shared)

    def _start_builtin(self, serving: _Serving, details: ExternalDetails, why: str) -> None:
        """Start the built-in's stream; ``why`` it serves, for the run's condition where a
        registered handler served the run before."""
        assert self._builtin is not None
        if details.builtin_error is not None:
            raise details.builtin_error
        _check_sharing(details, is_shared(self._builtin, details.builtin), "built-in handler")
        self._note_builtin()
        serving.builtin = steps.Steps(self._builtin.discover(details.builtin))
        serving.announce = why if serving.served_external else None
        serving.served_external = False

    async def _serve_builtin(
        self, serving: _Serving, details: ExternalDetails, changed: asyncio.Event
    ) -> AsyncGenerator[Sequence[Device], None]:
        """The built-in's lists until ``changed``; it goes on serving where it stood in for a
        handler (its last list again, without the stand-in's note)."""
        if serving.builtin is None:
            self._start_builtin(serving, details, "no handler registered under its name")
        elif serving.last is not None:
            yield serving.listed(serving.last, self.name)
        builtin = serving.builtin
        assert builtin is not None
        while True:
            await steps.wait_any([builtin.next()], [changed], None)
            if not builtin.ready():
                return
            yield serving.listed(serving.take(), self.name)

    async def _stand_in(
        self, serving: _Serving, registration: Registration, details: ExternalDetails
    ) -> AsyncGenerator[Sequence[Device], None]:
        """``registration`` has not answered this run's ``Discover`` yet: it is tried, with
        backoff, while the built-in serves (from the start where the run served nothing yet
        and the handler refused or could not be dialled; otherwise after ``HEAD_START``).
        Once it answers, it serves (``_take_over``); until then the built-in's lists carry a
        note saying why (a discovery warning: this node's ``DiscoveryHealthy`` condition)."""
        where = f"{registration.name!r} at {registration.endpoint}"
        loop = asyncio.get_running_loop()
        tries = retries.Tries(self._grace)
        trial: steps.Steps[list[Device]] | None = None
        silent_at = retry_at = loop.time()  # when a pending call counts as not answering
        builtin_at = loop.time() + (0.0 if serving.builtin is not None else HEAD_START)
        try:
            while True:
                changed = self._registrations.changed(self.name)
                again = self._registrations.registered_again(self.name)
                if self._registrations.get(self.name) != registration:
                    return  # another endpoint registered, or dropped: the caller looks again
                now = loop.time()
                if trial is None and now >= retry_at:
                    trial = steps.Steps(
                        stream.discover(registration, details.raw, details.properties)
                    )
                    silent_at = now + HEAD_START
                if serving.builtin is None and now >= builtin_at:
                    self._start_builtin(serving, details, f"the handler registered at "
                                        f"{registration.endpoint} has not answered")
                reads = [s.next() for s in (trial, serving.builtin) if s is not None]
                timers = [at for at, waiting in (
                    (retry_at, trial is None), (builtin_at, serving.builtin is None),
                    (silent_at, trial is not None and serving.standing_in is None)) if waiting]
                wakes = [changed, again] if trial is None and tries.wakes_on_register else [changed]
                await steps.wait_any(reads, wakes, max(0.0, min(timers) - now) if timers else None)
                if trial is None and again.is_set() and tries.wakes_on_register:
                    retry_at = loop.time()  # it is back: dial it now
                if trial is not None and trial.ready():
                    try:
                        first = trial.take()
                    except stream.HandlerUnreachable as exc:
                        failure = retries.Failure(str(exc), retries.UNREACHABLE)
                    except stream.HandlerFailed as exc:
                        failure = retries.Failure(str(exc), retries.REFUSED)
                    except steps.Ended:
                        failure = retries.Failure("it ended its stream without a list",
                                                  retries.ENDED)
                    else:
                        answered = trial.detach()
                        trial = None
                        self._answered = registration.generation
                        if registration.shared != details.shared:
                            await steps.close_quietly(answered)
                            raise SharingChanged(
                                f"the handler registered at {registration.endpoint} answered; "
                                f"it serves {'shared' if registration.shared else 'local'} "
                                "devices; restarting discovery"
                            )
                        await serving.stop_builtin()
                        lists = self._take_over(serving, registration, details, (first, answered))
                        async with contextlib.aclosing(lists):
                            async for devices in lists:
                                yield devices
                        return
                    await trial.close()
                    trial = None
                    delay = tries.failed(failure)
                    if delay is None:
                        self._drop(registration, where, tries)
                        return
                    retry_at = loop.time() + delay
                    builtin_at = min(builtin_at, now)
                    noted = serving.note(self._unanswered(where, failure.problem))
                    if noted and serving.last is not None:
                        yield serving.listed(serving.last, self.name)  # the note, at once
                    continue
                if (trial is not None and serving.standing_in is None
                        and loop.time() >= silent_at):  # connected, and no list yet
                    serving.note(self._unanswered(where, f"no list {HEAD_START:g}s after the call"))
                    if serving.last is not None:
                        yield serving.listed(serving.last, self.name)
                if serving.builtin is not None and serving.builtin.ready():
                    yield serving.listed(serving.take(), self.name)
        finally:
            if trial is not None:
                await trial.close()
            serving.note(None)

    def _unanswered(self, where: str, problem: str) -> str:
        return (f"discovery handler {where} has not answered Discover ({problem}); the "
                f"built-in {self.name!r} serves on this node until it does")

    async def _take_over(
        self, serving: _Serving, registration: Registration, details: ExternalDetails,
        answered: tuple[list[Device], AsyncIterator[list[Device]]] | None,
    ) -> AsyncGenerator[Sequence[Device], None]:
        self._note_takeover(registration)
        serving.served_external = True
        served = self._serve_registered(registration, details, answered)
        async with contextlib.aclosing(served):
            async for devices in served:
                yield self._noting_takeover(devices, registration)

    async def _serve_registered(
        self, registration: Registration, details: ExternalDetails,
        answered: tuple[list[Device], AsyncIterator[list[Device]]] | None,
    ) -> AsyncGenerator[Sequence[Device], None]:
        """Stream ``registration``'s lists (from a stream that ``answered`` already, where
        given), dialling again after a loss, until it is replaced or dropped (away for longer
        than the grace)."""
        where = f"{registration.name!r} at {registration.endpoint}"
        tries = retries.Tries(self._grace)
        announce = True
        while self._registrations.get(self.name) == registration:
            changed = self._registrations.changed(self.name)
            again = self._registrations.registered_again(self.name)
            opened = (steps.prepended(*answered) if answered is not None
                      else stream.discover(registration, details.raw, details.properties))
            answered = None
            failure = retries.Failure("it ended its stream", retries.ENDED)
            try:
                lists = steps.until(opened, changed)
                async with contextlib.aclosing(lists):
                    async for devices in lists:
                        tries.succeeded()
                        if announce:
                            announce = False
                            yield HandlerStatus(devices, ready=True, message=(
                                f"served by discovery handler {where} "
                                f"({registration.endpoint_type.name}, "
                                f"{'shared' if registration.shared else 'local'} devices)"
                            ))
                        else:
                            yield devices
            except stream.HandlerUnreachable as exc:
                failure = retries.Failure(str(exc), retries.UNREACHABLE)
            except stream.HandlerFailed as exc:  # it is there, and said why it cannot serve
                failure = retries.Failure(str(exc), retries.REFUSED)
            if changed.is_set():
                return  # another endpoint registered, or dropped: the caller looks again
            delay = tries.failed(failure)
            if delay is None:
                self._drop(registration, where, tries)
                return
            if tries.failures == 1:
                state = "failed" if failure.kind == retries.REFUSED else "is unreachable"
                log.warning("discovery handler %s %s (%s); its devices are offline, "
                            "retrying", where, state, failure.problem,
                            extra={"handler": self.name})
                announce = True
                yield HandlerStatus([], ready=False, message=(
                    f"discovery handler {where} {state} ({failure.problem}); retrying"
                ))
            wakes = [changed, again] if tries.wakes_on_register else [changed]
            await steps.any_of(*wakes, within=delay)

    def _drop(self, registration: Registration, where: str, tries: retries.Tries) -> None:
        if self._registrations.drop(registration):
            log.warning("discovery handler %s unreachable for %.0fs (grace %.0fs): "
                        "registration dropped", where, tries.away, self._grace,
                        extra={"handler": self.name})

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


def _check_sharing(details: ExternalDetails, shared: bool, side: str) -> None:
    if shared != details.shared:
        raise SharingChanged(
            f"the {side} serves {'shared' if shared else 'local'} devices; restarting discovery"
        )


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
