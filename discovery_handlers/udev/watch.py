"""Event-driven udev discovery: enumerate once, then follow uevents; yield a list only on change.

The monitor socket sits on the asyncio loop; bursts are debounced (``DEBOUNCE_QUIET_S``,
``DEBOUNCE_MAX_S``) and a failed socket reopened up to ``MAX_REOPENS_IN_A_ROW`` times. Behaviour:
docs/handlers/udev.md, "Hot-plug, and what runs where".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from discovery_handlers.contract import Device, run_blocking
from discovery_handlers.udev import udevlib
from discovery_handlers.udev.details import UdevDetails
from discovery_handlers.udev.devices import NodeRecord, build_devices

log = logging.getLogger(__name__)

#: A burst is over once no event came for this long (the kernel enumerates a hub's devices one
#: after another, tens of milliseconds apart)...
DEBOUNCE_QUIET_S = 0.1
#: ...or this long after its first event, whichever comes first (a long stream of events still
#: yields a list every second).
DEBOUNCE_MAX_S = 1.0
#: Reopening a failed monitor more often than this without one good event in between gives up.
MAX_REOPENS_IN_A_ROW = 5
#: A socket that keeps waking the loop without delivering an event (a shut-down socket reads
#: as end-of-file forever) is a broken one; libudev drops the odd foreign message, not this many.
MAX_EMPTY_WAKEUPS = 64


class MonitorFailed(RuntimeError):
    """The uevent monitor keeps failing; the agent reports this and restarts discovery."""


def rescan_roots(events: list[udevlib.Event]) -> list[str]:
    """The sysfs paths to re-read after ``events``: every path an event names (a move's old
    path too), less those inside another one (re-reading a subtree covers its children)."""
    touched = sorted({p for e in events for p in (e.sys_path, e.old_sys_path) if p})
    roots: list[str] = []
    for path in touched:  # sorted: a parent comes before its children
        if not any(path.startswith(root + "/") for root in roots):
            roots.append(path)
    return roots


class Watcher:
    """Follows the host's devices for one Configuration's details.

    ``changes()`` yields the full device list at once and again whenever it changes. Tests and
    benchmarks read ``monitor`` (its ``fileno``), ``reopens``, ``full_scans``, ``last_scan_s``.
    """

    def __init__(self, details: UdevDetails, *,
                 monitor_factory: Callable[[Any], udevlib.Monitor] = udevlib.Monitor) -> None:
        self.details = details
        self.monitor: udevlib.Monitor | None = None
        self.reopens = 0
        self.full_scans = 0
        self.events_handled = 0
        self.last_scan_s = 0.0  # how long the latest full enumeration took
        self._monitor_factory = monitor_factory
        self._context: Any = None
        self._matched: dict[str, NodeRecord] = {}
        self._pending: list[udevlib.Event] = []
        self._overflowed = False
        self._broken: Exception | None = None
        self._wake = asyncio.Event()
        self._reopens_in_a_row = 0
        self._empty_wakeups = 0

    async def changes(self) -> AsyncIterator[list[Device]]:
        loop = asyncio.get_running_loop()
        self._context = await run_blocking(udevlib.new_context)
        try:
            await self._open(loop)  # before enumerating, so no event falls in between
            await self._full_scan()
            last = self._devices()
            yield last
            while True:
                await self._gather_burst(loop)
                await self._handle_burst(loop)
                current = self._devices()
                if current != last:
                    last = current
                    yield current
        finally:
            self._close(loop)

    async def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        self.monitor = await run_blocking(self._monitor_factory, self._context)
        loop.add_reader(self.monitor.fileno(), self._on_readable)
        log.info("udev: following %s uevents", self.monitor.source)

    def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.monitor is not None:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(self.monitor.fileno())
            self.monitor.close()
            self.monitor = None

    def _on_readable(self) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        try:
            events = monitor.drain()
            self._empty_wakeups = 0 if events else self._empty_wakeups + 1
            if self._empty_wakeups > MAX_EMPTY_WAKEUPS:
                raise udevlib.MonitorBroken(0, "uevent socket readable but delivers nothing")
            self._pending.extend(events)
        except udevlib.Overflow:
            log.warning("udev: monitor overflowed (events lost); re-enumerating")
            self._overflowed = True
        except Exception as exc:
            self._broken = exc
            self._empty_wakeups = 0
            with contextlib.suppress(OSError, ValueError):
                asyncio.get_running_loop().remove_reader(monitor.fileno())
        self._wake.set()

    async def _gather_burst(self, loop: asyncio.AbstractEventLoop) -> None:
        await self._wake.wait()
        first = loop.time()
        while True:
            self._wake.clear()
            remaining = DEBOUNCE_MAX_S - (loop.time() - first)
            if remaining <= 0 or self._broken is not None:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), min(DEBOUNCE_QUIET_S, remaining))
            except TimeoutError:
                return

    async def _handle_burst(self, loop: asyncio.AbstractEventLoop) -> None:
        events, self._pending = self._pending, []
        if self._broken is not None:
            broken, self._broken = self._broken, None
            await self._reopen(loop, broken)
            return
        if self._overflowed:
            self._overflowed = False
            await self._full_scan()
            return
        self._reopens_in_a_row = 0
        self.events_handled += len(events)
        for path in rescan_roots(events):
            # the subtree's records are replaced by what is there now (nothing, once removed)
            self._drop_subtree(path)
            found = await run_blocking(udevlib.subtree_matches, self._context,
                                       self.details.rules, path)
            self._matched.update(found)

    async def _reopen(self, loop: asyncio.AbstractEventLoop, cause: Exception) -> None:
        self._reopens_in_a_row += 1
        if self._reopens_in_a_row > MAX_REOPENS_IN_A_ROW:
            raise MonitorFailed(
                f"udev event monitor failed {MAX_REOPENS_IN_A_ROW} times in a row: {cause}")
        log.warning("udev: event monitor failed (%s); reopening it and re-enumerating", cause)
        self._close(loop)
        self.reopens += 1
        try:
            await self._open(loop)
        except Exception as exc:
            raise MonitorFailed(f"udev event monitor cannot be reopened: {exc}") from exc
        await self._full_scan()

    async def _full_scan(self) -> None:
        self.full_scans += 1
        started = time.monotonic()
        self._matched = await run_blocking(udevlib.enumerate_matches, self._context,
                                           self.details.rules)
        self.last_scan_s = time.monotonic() - started

    def _drop_subtree(self, sys_path: str) -> None:
        devpath = sys_path[len("/sys"):] if sys_path.startswith("/sys/") else sys_path
        below = devpath + "/"
        for key in [k for k in self._matched if k == devpath or k.startswith(below)]:
            del self._matched[key]

    def _devices(self) -> list[Device]:
        return build_devices(self._matched.values(), group_recursive=self.details.group_recursive,
                             permissions=self.details.permissions)
