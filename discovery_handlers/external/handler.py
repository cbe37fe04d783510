"""A name served by registered out-of-process handlers: the contract adapter.

``ExternalHandler`` discovers through every endpoint registered under its name, with the built-in
of that name standing in until one answers or serving while none is registered;
``ExternalHandlers`` is the registry's resolver. Behaviour: docs/handlers/akri.md, "How it works"
and its two subsections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from discovery_handlers.contract import (
    Device,
    DeviceList,
    DiscoveryHandler,
    InvalidDetails,
    PropertyValue,
    is_shared,
)
from discovery_handlers.external import merging, retries, steps, stream
from discovery_handlers.external.endpoint_events import Endpoint, Event, Silent, endpoint_events
from discovery_handlers.external.registrations import Registration, Registrations
from discovery_handlers.external.standing_in import BuiltinServing
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
        #: Generations of the registrations that answered a Discover on this node, the latest
        #: to answer last.
        self._answered: list[int] = []

    def parse_details(
        self, details: str, properties: Mapping[str, PropertyValue]
    ) -> ExternalDetails:
        parsed = ExternalDetails(raw=details, properties=dict(properties))
        registrations = self._registrations.endpoints(self.name)
        builtin_serves = False
        if self._builtin is not None:
            try:
                parsed.builtin = self._builtin.parse_details(details, properties)
                parsed.shared = is_shared(self._builtin, parsed.builtin)
                builtin_serves = True
            except InvalidDetails as exc:
                if not registrations:
                    raise  # nothing else could make sense of them
                parsed.builtin_error = exc
        # Endpoints that have not answered yet leave the built-in serving (it stands in).
        answered = self._latest_answered(registrations)
        if answered is not None:
            parsed.shared = answered.shared
        elif registrations and not builtin_serves:
            parsed.shared = registrations[0].shared
        return parsed

    def _latest_answered(self, registrations: Sequence[Registration]) -> Registration | None:
        by_generation = {r.generation: r for r in registrations}
        for generation in reversed(self._answered):
            if generation in by_generation:
                return by_generation[generation]
        return None

    def _note_answer(self, registration: Registration) -> None:
        if registration.generation in self._answered:
            self._answered.remove(registration.generation)
        self._answered.append(registration.generation)

    async def discover(self, details: Any) -> AsyncGenerator[Sequence[Device], None]:
        """Discover through every endpoint registered under the name (``merging``), with the
        built-in standing in until one has answered, or serving while none is registered."""
        assert isinstance(details, ExternalDetails)
        serving = BuiltinServing()
        endpoints: dict[Registration, Endpoint] = {}
        loop = asyncio.get_running_loop()
        builtin_at = loop.time() + HEAD_START
        shown: merging.Verdict | None = None
        try:
            while True:
                changed = self._registrations.changed(self.name)
                current = self._registrations.endpoints(self.name)
                lost = await self._follow(endpoints, current, details)
                if not current:
                    shown = None
                    if self._builtin is None:
                        yield HandlerStatus([], ready=False, message=(
                            f"discovery handler {self.name!r} is not registered on this node: "
                            f"waiting for it to register on {self._waiting_on} (installed "
                            f"handlers: {', '.join(known_handler_names()) or 'none'})"
                        ))
                        await changed.wait()
                        continue
                    serving.note(())
                    lists = self._serve_builtin(serving, details, changed)
                    async with contextlib.aclosing(lists):
                        async for devices in lists:
                            yield devices
                    continue
                standing_in = self._can_stand_in(details) and not serving.served_external
                if not standing_in:
                    await serving.stop_builtin()
                    if all(r.shared != details.shared for r in current):
                        _check_sharing(details, current[0].shared,
                                       f"handler registered at {current[0].endpoint}")
                if lost and not standing_in:  # an endpoint gone took its devices along
                    standings = [e.standing for e in endpoints.values()]
                    listed, shown = self._listed(standings, details, shown)
                    yield listed if listed is not None else merging.devices(standings)
                now = loop.time()
                if standing_in and serving.builtin is None and (now >= builtin_at or any(
                        e.standing.failure is not None for e in endpoints.values())):
                    self._start_builtin(serving, details, "no registered handler has answered")
                reads: list[asyncio.Future[Any]] = [e.events.next() for e in endpoints.values()]
                if serving.builtin is not None:
                    reads.append(serving.builtin.next())
                timer = (max(0.0, builtin_at - now)
                         if standing_in and serving.builtin is None else None)
                await steps.wait_any(reads, [changed], timer)
                heard = False
                for endpoint in list(endpoints.values()):
                    if endpoint.events.ready():
                        heard |= await self._hear(endpoint, endpoints, serving, details)
                if standing_in and not serving.served_external:
                    noted = serving.note(tuple(
                        self._unanswered(e) for e in endpoints.values() if
                        e.standing.devices is None and (e.standing.failure or e.silent)))
                    if serving.builtin is not None and serving.builtin.ready():
                        yield serving.listed(serving.take(), self.name)
                    elif noted and serving.last is not None:
                        yield serving.listed(serving.last, self.name)  # the note, at once
                    continue
                if heard:
                    listed, shown = self._listed(
                        [e.standing for e in endpoints.values()], details, shown)
                    if listed is not None:
                        yield listed
        except steps.Ended:
            return  # the built-in ended its stream: nothing more will come
        finally:
            for endpoint in endpoints.values():
                await endpoint.events.close()
            await serving.stop_builtin()

    async def _follow(self, endpoints: dict[Registration, Endpoint],
                      current: Sequence[Registration], details: ExternalDetails) -> bool:
        """Open a stream to each endpoint newly registered, close those of endpoints gone;
        True where one gone had devices listed."""
        lost = False
        for registration in [r for r in endpoints if r not in current]:
            gone = endpoints.pop(registration)
            await gone.events.close()
            lost |= gone.standing.devices is not None
        for registration in current:
            if registration not in endpoints:
                endpoints[registration] = Endpoint(
                    merging.Standing(registration),
                    steps.Steps(self._endpoint_events(registration, details)))
        return lost

    async def _hear(self, endpoint: Endpoint, endpoints: dict[Registration, Endpoint],
                    serving: BuiltinServing, details: ExternalDetails) -> bool:
        """Take ``endpoint``'s event into its standing; True where the run's list or verdict
        may have changed."""
        standing = endpoint.standing
        registration = standing.registration
        try:
            event = endpoint.events.take()
        except steps.Ended:  # it was dropped after the grace
            endpoints.pop(registration, None)
            return standing.devices is not None
        if isinstance(event, Silent):
            endpoint.silent = True
            return False
        if isinstance(event, retries.Failure):
            if standing.devices is not None:
                state = "failed" if event.kind == retries.REFUSED else "is unreachable"
                log.warning("discovery handler %s %s (%s); its devices are offline, retrying",
                            standing.where, state, event.problem, extra={"handler": self.name})
            changed = standing.devices is not None or standing.failure != event
            standing.devices, standing.failure = None, event
            return changed
        self._note_answer(registration)
        if registration.shared != details.shared:
            if not any(e.standing.serving for e in endpoints.values()):
                raise SharingChanged(
                    f"the handler registered at {registration.endpoint} answered; it serves "
                    f"{'shared' if registration.shared else 'local'} devices; restarting "
                    "discovery"
                )
            changed = not standing.left_out
            standing.left_out, standing.devices, standing.failure = True, event, None
            return changed
        standing.devices, standing.failure, endpoint.silent = event, None, False
        if not serving.served_external:
            await serving.stop_builtin()
            serving.served_external = True
            self._note_takeover(registration)
        return True

    def _listed(self, standings: Sequence[merging.Standing], details: ExternalDetails,
                shown: merging.Verdict | None
                ) -> tuple[Sequence[Device] | None, merging.Verdict | None]:
        """The run's list from the endpoints' standings (None: nothing to say yet), and the
        verdict it carries: a ``HandlerStatus`` where the verdict changed."""
        verdict = merging.verdict(standings)
        if verdict is None:
            return None, shown
        notes = merging.warnings(standings, shared=details.shared)
        serving = [s.registration.endpoint for s in standings if s.serving]
        if self._builtin is not None and serving:
            notes = (*notes, f"discovery handler {self.name!r} registered at "
                     f"{', '.join(serving)} serves in place of the built-in {self.name!r} "
                     "on this node")
        devices = merging.devices(standings)
        if verdict != shown:
            return HandlerStatus(devices, notes, ready=verdict.ready,
                                 message=verdict.message), verdict
        return (DeviceList(devices, notes) if notes else devices), verdict

    def _endpoint_events(
        self, registration: Registration, details: ExternalDetails,
    ) -> AsyncGenerator[Event, None]:
        return endpoint_events(
            registration, details.raw, details.properties, registrations=self._registrations,
            grace=self._grace, head_start=HEAD_START,
        )

    def _can_stand_in(self, details: ExternalDetails) -> bool:
        """Whether the built-in can serve the run while no endpoint has answered: it parsed
        the details and names Instances as the run does."""
        if self._builtin is None or details.builtin_error is not None:
            return False
        return is_shared(self._builtin, details.builtin) == details.shared

    def _start_builtin(self, serving: BuiltinServing, details: ExternalDetails, why: str) -> None:
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
        self, serving: BuiltinServing, details: ExternalDetails, changed: asyncio.Event
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

    def _unanswered(self, endpoint: Endpoint) -> str:
        failure = endpoint.standing.failure
        problem = (failure.problem if failure is not None
                   else f"no list {HEAD_START:g}s after the call")
        return (f"discovery handler {endpoint.standing.where} has not answered Discover "
                f"({problem}); the built-in {self.name!r} serves on this node until it does")

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
