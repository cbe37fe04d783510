"""Wake-ups when entries of the kubelet's device-plugin directory appear, vanish or move.

A kubelet restart shows itself only in that directory (it deletes every plugin
socket and creates a new ``kubelet.sock``). Polling the sockets costs a ``stat`` per plugin per
tick, all day, on a node where nothing changes; inotify (through ``asyncinotify``: small, pure
Python over the kernel API, asyncio-native, typed) makes the manager sleep until the directory
actually changes. Where inotify is not available (no directory yet, the per-user watch limit
reached) ``DirectoryWatch`` says so and the caller polls instead, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from asyncinotify import Inotify, Mask

log = logging.getLogger(__name__)

#: Entry changes that can mean a kubelet restart or a plugin socket gone; the directory itself
#: deleted or moved ends the watch (``IGNORED`` follows), so the caller falls back to polling.
DIRECTORY_EVENTS = (
    Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.DELETE_SELF
    | Mask.MOVE_SELF | Mask.ONLYDIR
)
_ENDED = Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF


class DirectoryWatch:
    """Sets ``changed`` whenever ``directory``'s entries change; ``alive`` while it can tell."""

    def __init__(self, directory: Path, changed: asyncio.Event) -> None:
        self._directory = directory
        self._changed = changed
        self._inotify: Inotify | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self._reader is not None and not self._reader.done()

    async def start(self) -> bool:
        """Begin watching; False (and polling is the caller's) when inotify cannot watch it."""
        await self.close()
        try:
            inotify = Inotify()
        except OSError as error:
            log.warning("inotify unavailable (%s): polling the plugin directory", error)
            return False
        try:
            inotify.add_watch(self._directory, DIRECTORY_EVENTS)
        except OSError as error:
            inotify.close()
            log.warning(
                "cannot watch %s with inotify (%s): polling it", self._directory, error
            )
            return False
        self._inotify = inotify
        self._reader = asyncio.create_task(self._read(inotify), name="plugin-dir-inotify")
        return True

    async def _read(self, inotify: Inotify) -> None:
        async for event in inotify:
            self._changed.set()  # a lost-events overflow (Q_OVERFLOW) wakes the caller too
            if event.mask & _ENDED:
                # The directory went (or events were lost): the caller notices ``alive`` is
                # False, polls, and watches again once the directory is back.
                log.info("plugin directory watch ended (%s)", event.mask)
                return

    async def close(self) -> None:
        """Stop reading, then close the descriptor (never one the event loop still polls)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            with contextlib.suppress(OSError):
                inotify.close()
