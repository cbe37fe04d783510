"""Follow a handler's ``discover`` stream in a test: keep the latest list, wait for a condition.

The opcua tests and benchmark all run ``discover`` in the background and wait,
with a deadline and a message saying what was expected, until the latest list has some shape
(a server present, gone, unhealthy). Waiting polls the latest list; nothing sleeps in place of
synchronisation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from discovery_handlers.contract import Device
from discovery_handlers.opcua import handler

POLL_S = 0.02
DEFAULT_WITHIN_S = 30.0  # generous for a shared 2-core machine; never a pass/fail timing


class DeviceWatch:
    """``async with DeviceWatch(details) as watch``: discovery runs until the block ends."""

    def __init__(self, details: Any) -> None:
        self._details = details
        self.lists: list[Sequence[Device]] = []
        self.times: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DeviceWatch:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        async for devices in handler.discover(self._details):
            self.lists.append(devices)
            self.times.append(loop.time())

    @property
    def latest(self) -> dict[str, Device]:
        return {d.id: d for d in self.lists[-1]} if self.lists else {}

    async def until(self, check: Callable[[dict[str, Device]], bool], *, what: str,
                    within: float = DEFAULT_WITHIN_S) -> dict[str, Device]:
        """The latest list once ``check`` holds for it; fail naming ``what`` after ``within``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # discovery ended: raise what it raised
                raise AssertionError(f"discovery ended while waiting for {what}")
            if self.lists and check(self.latest):
                return self.latest
            if loop.time() > deadline:
                shown = {k: (v.health.healthy, v.health.reason) for k, v in self.latest.items()}
                raise AssertionError(f"waited {within:.0f}s for {what}; latest: {shown}")
            await asyncio.sleep(POLL_S)
