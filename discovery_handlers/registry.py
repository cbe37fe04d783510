"""Find discovery handlers by name through the ``edgeplug.discovery_handlers`` entry-point group.

``load_handler`` imports a handler only when a Configuration names it; ``register_handler`` adds
one in-process; ``set_resolver`` lets the agent serve Akri handler names (docs/handlers.md, "Shared
helpers").
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

from discovery_handlers.contract import DiscoveryHandler

ENTRY_POINT_GROUP = "edgeplug.discovery_handlers"

_loaded: dict[str, DiscoveryHandler] = {}

#: Given a name and the installed handler of that name (None when none is), the handler to run
#: instead, or None for the installed one. The agent sets it while it hosts Akri's handler
#: registration, so a registered out-of-process handler can serve a name.
Resolver = Callable[[str, DiscoveryHandler | None], DiscoveryHandler | None]
_resolver: Resolver | None = None


class UnknownHandler(LookupError):
    """No installed package declares a handler of this name."""

    def __init__(self, name: str, known: list[str]) -> None:
        listing = ", ".join(known) if known else "none installed"
        super().__init__(
            f"unknown discovery handler {name!r}; known handlers: {listing} "
            f"(entry-point group {ENTRY_POINT_GROUP!r})"
        )
        self.name = name
        self.known = known


class BrokenHandler(ImportError):
    """The entry point exists but does not load, or does not give a handler."""


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_handler_names() -> list[str]:
    """Names of every installed handler, sorted; imports none of them."""
    return sorted(_entry_points())


def register_handler(handler: DiscoveryHandler) -> None:
    """Make ``handler`` loadable by its name in this process, as an entry point would.

    For programs that embed the agent with a handler of their own, and for tests; an installed
    package declares an entry point instead.
    """
    if not isinstance(handler, DiscoveryHandler):
        raise BrokenHandler(f"{type(handler).__name__} is not a DiscoveryHandler")
    _loaded[handler.name] = handler


def set_resolver(resolver: Resolver | None) -> None:
    """Route ``load_handler`` through ``resolver`` (None: installed handlers only)."""
    global _resolver
    _resolver = resolver


def load_handler(name: str) -> DiscoveryHandler:
    """Import (once) and return the handler a Configuration names.

    Raises ``UnknownHandler`` listing the known names, or ``BrokenHandler`` when the entry point
    fails to import or does not satisfy the ``DiscoveryHandler`` protocol.
    """
    if _resolver is None:
        return _load_installed(name)
    try:
        installed: DiscoveryHandler | None = _load_installed(name)
    except UnknownHandler:
        installed = None
    resolved = _resolver(name, installed)
    if resolved is not None:
        return resolved
    if installed is None:
        raise UnknownHandler(name, known_handler_names())
    return installed


def _load_installed(name: str) -> DiscoveryHandler:
    cached = _loaded.get(name)
    if cached is not None:
        return cached
    points = _entry_points()
    point = points.get(name)
    if point is None:
        raise UnknownHandler(name, sorted(points))
    try:
        loaded = point.load()
    except Exception as exc:
        raise BrokenHandler(
            f"discovery handler {name!r} ({point.value}) failed to load: {exc}"
        ) from exc
    if not isinstance(loaded, DiscoveryHandler):
        raise BrokenHandler(
            f"discovery handler {name!r} ({point.value}) is a {type(loaded).__name__}, "
            "not a DiscoveryHandler (needs name, shared, parse_details, discover)"
        )
    if loaded.name != name:
        raise BrokenHandler(
            f"entry point {name!r} ({point.value}) gives a handler named {loaded.name!r}"
        )
    _loaded[name] = loaded
    return loaded
