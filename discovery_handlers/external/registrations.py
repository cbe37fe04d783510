"""The node's table of registered out-of-process discovery handlers (Akri's protocol).

``Registrations.register`` and ``drop`` change it; runs read ``endpoints`` and wait on ``changed``
and ``registered_again``. Plain asyncio, no gRPC, no Kubernetes; why it is a shared table:
docs/handlers/akri.md, "The modules".
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass

#: Schemes a NETWORK endpoint may carry (Akri's handlers in pods register ``http://ip:port``).
_INSECURE_SCHEMES = ("http://", "grpc://")


class EndpointType(enum.Enum):
    """How a handler is reached; the values are Akri's wire values."""

    UDS = 0
    NETWORK = 1


class BadRegistration(ValueError):
    """A registration the agent refuses (the message says which field and why)."""


@dataclass(frozen=True)
class Registration:
    """One handler's registration. ``generation`` grows with every registration on this node,
    so a run can tell "the same handler registered again" from "nothing changed"."""

    name: str
    endpoint: str
    endpoint_type: EndpointType
    shared: bool
    generation: int

    def target(self) -> str:
        """The gRPC target the agent dials."""
        if self.endpoint_type is EndpointType.UDS:
            return f"unix://{self.endpoint}"
        for scheme in _INSECURE_SCHEMES:
            if self.endpoint.startswith(scheme):
                return self.endpoint[len(scheme):]
        return self.endpoint


def check(name: str, endpoint: str, endpoint_type: EndpointType) -> None:
    """Refuse a registration no run could use; raises ``BadRegistration``."""
    if not name:
        raise BadRegistration("name is empty")
    if not endpoint:
        raise BadRegistration("endpoint is empty")
    if endpoint_type is EndpointType.UDS and not endpoint.startswith("/"):
        raise BadRegistration(f"UDS endpoint {endpoint!r} is not an absolute socket path")
    if endpoint_type is EndpointType.NETWORK and endpoint.startswith("https://"):
        raise BadRegistration(f"NETWORK endpoint {endpoint!r}: TLS is not supported")


class Registrations:
    """Every registered endpoint per name, in the order they registered, and wake-ups for
    whoever waits on a name: ``changed`` (an endpoint added, replaced or dropped) and
    ``registered_again`` (any registration, the same endpoint too)."""

    def __init__(self) -> None:
        self._current: dict[str, dict[tuple[str, EndpointType], Registration]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._again: dict[str, asyncio.Event] = {}
        self._generations = itertools.count(1)
        self._listeners: list[Callable[[], None]] = []

    def register(
        self, *, name: str, endpoint: str, endpoint_type: EndpointType, shared: bool
    ) -> Registration:
        """Record an endpoint of ``name``; raises ``BadRegistration``.

        Another endpoint is added beside those registered. The same endpoint registered again
        (Akri's handlers register again whenever the agent closes one of their streams, and
        after a restart) keeps its registration, so the streams that work go on; it only wakes
        runs waiting to dial the handler. The same endpoint with another sharing replaces it.
        """
        check(name, endpoint, endpoint_type)
        _set(self._again, name)
        endpoints = self._current.setdefault(name, {})
        current = endpoints.get((endpoint, endpoint_type))
        if current is not None and current.shared == shared:
            return current
        registration = Registration(
            name=name, endpoint=endpoint, endpoint_type=endpoint_type, shared=shared,
            generation=next(self._generations),
        )
        endpoints[(endpoint, endpoint_type)] = registration
        self._wake(name)
        return registration

    def drop(self, registration: Registration) -> bool:
        """Forget ``registration`` unless a newer one replaced it; True when it was dropped."""
        endpoints = self._current.get(registration.name, {})
        key = (registration.endpoint, registration.endpoint_type)
        if endpoints.get(key) != registration:
            return False
        del endpoints[key]
        if not endpoints:
            del self._current[registration.name]
        self._wake(registration.name)
        return True

    def endpoints(self, name: str) -> tuple[Registration, ...]:
        """``name``'s endpoints, the earliest registered first."""
        return tuple(self._current.get(name, {}).values())

    def get(self, name: str) -> Registration | None:
        """``name``'s latest registered endpoint, None when it has none."""
        return max(self.endpoints(name), key=lambda r: r.generation, default=None)

    def names(self) -> list[str]:
        return sorted(self._current)

    def changed(self, name: str) -> asyncio.Event:
        """An event set at the next change of ``name``'s endpoints (fetch it before reading
        them, so a change in between is not missed)."""
        return _event(self._changed, name)

    def registered_again(self, name: str) -> asyncio.Event:
        """An event set at the next registration of ``name``, a change or not."""
        return _event(self._again, name)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of an endpoint (the agent's metric)."""
        self._listeners.append(listener)

    def _wake(self, name: str) -> None:
        _set(self._changed, name)
        for listener in self._listeners:
            listener()


def _event(events: dict[str, asyncio.Event], name: str) -> asyncio.Event:
    event = events.get(name)
    if event is None:
        event = events[name] = asyncio.Event()
    return event


def _set(events: dict[str, asyncio.Event], name: str) -> None:
    event = events.pop(name, None)
    if event is not None:
        event.set()
