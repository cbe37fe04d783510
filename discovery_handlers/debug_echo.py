"""``debugEcho``: a discovery handler whose devices are a list in its details, for tests and demos.

Details and the availability file: docs/handlers.md, "`debugEcho`".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from discovery_handlers.contract import Device, InvalidDetails, PropertyValue
from discovery_handlers.yaml_details import load_mapping, refuse_unknown

NAME = "debugEcho"
DESCRIPTION_PROPERTY = "DEBUG_ECHO_DESCRIPTION"
ALL_OFFLINE_MARKER = "OFFLINE"
#: Seconds between stat() calls on the availability file when inotify cannot watch it.
AVAILABILITY_POLL_INTERVAL = 0.05
_KNOWN_FIELDS = frozenset({"descriptions", "shared", "availabilityFile"})


@dataclass(frozen=True)
class DebugEchoDetails:
    """Parsed ``discoveryDetails`` of a debugEcho Configuration."""

    descriptions: tuple[str, ...]
    shared: bool = True
    availability_file: Path | None = None


class DebugEchoHandler:
    """The debugEcho handler; ``handler`` below is the entry point's object."""

    name = NAME
    shared = True

    def parse_details(
        self, details: str, properties: Mapping[str, PropertyValue]
    ) -> DebugEchoDetails:
        raw = load_mapping(details, field="descriptions",
                           expected="required: a non-empty list of strings")
        refuse_unknown(raw, _KNOWN_FIELDS)
        descriptions = raw.get("descriptions")
        if not isinstance(descriptions, list) or not descriptions:
            raise InvalidDetails("descriptions", "required: a non-empty list of strings")
        seen: set[str] = set()
        for index, item in enumerate(descriptions):
            if not isinstance(item, str) or not item:
                raise InvalidDetails(f"descriptions[{index}]", "must be a non-empty string")
            if item in seen:
                raise InvalidDetails(f"descriptions[{index}]", f"duplicate description {item!r}")
            seen.add(item)
        shared = raw.get("shared", True)
        if not isinstance(shared, bool):
            raise InvalidDetails("shared", "must be true or false")
        availability = raw.get("availabilityFile")
        if availability is not None and (not isinstance(availability, str) or not availability):
            raise InvalidDetails("availabilityFile", "must be a file path")
        return DebugEchoDetails(
            descriptions=tuple(descriptions),
            shared=shared,
            availability_file=Path(availability) if availability else None,
        )

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        assert isinstance(details, DebugEchoDetails)
        path = details.availability_file
        if path is None:
            yield [_device(d) for d in details.descriptions]
            await asyncio.Event().wait()  # the list never changes: wait to be cancelled
            return
        last: tuple[str, ...] | None = None
        stamp: tuple[int, int, int] | None = None
        offline: frozenset[str] = frozenset()
        changes = _changes(path)
        async with contextlib.aclosing(changes):
            async for notified in changes:
                # A poll reads the file only if its stamp moved; a notification always does: two
                # writes within one tick of the kernel's coarse clock can leave equal stamps.
                current = _stamp(path)
                if notified or current != stamp:
                    stamp = current
                    offline = _read_offline(path)
                visible = tuple(d for d in details.descriptions if _online(d, offline))
                if visible != last:
                    last = visible
                    yield [_device(d) for d in visible]


async def _changes(path: Path) -> AsyncGenerator[bool, None]:
    """Yield now and after every change that may concern ``path``: True where inotify said so
    (and at the start), False for each poll where inotify cannot watch."""
    from asyncinotify import Inotify, Mask  # only a running discovery needs it

    events = (
        Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.CLOSE_WRITE
        | Mask.MODIFY | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
    )
    inotify: Inotify | None = None
    try:
        inotify = Inotify()
        inotify.add_watch(path.parent, events)
    except OSError:
        if inotify is not None:
            inotify.close()
        inotify = None
    try:
        yield True
        if inotify is not None:
            async for event in inotify:
                if event.name is None or event.name == Path(path.name):
                    yield True
                if event.mask & (Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF):
                    break  # the directory went: poll from now on
        while True:
            await asyncio.sleep(AVAILABILITY_POLL_INTERVAL)
            yield False
    finally:
        if inotify is not None:
            inotify.close()


def _device(description: str) -> Device:
    return Device(id=description, properties={DESCRIPTION_PROPERTY: description})


def _online(description: str, offline: frozenset[str]) -> bool:
    return ALL_OFFLINE_MARKER not in offline and description not in offline


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read_offline(path: Path) -> frozenset[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


handler = DebugEchoHandler()
