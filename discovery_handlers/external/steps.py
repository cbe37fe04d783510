"""Reading several async streams at once: the plumbing of ``handler``, no gRPC, no devices.

``Steps`` reads a stream one item at a time, its pending read kept across other waits so no stream
restarts on another's wake-up; ``wait_any`` and ``any_of`` wait on reads, events and a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")


class Ended(Exception):
    """The stream ``Steps`` reads has ended."""


class Steps(Generic[_T]):
    """``items`` read one at a time: ``next`` starts (or returns the pending) read, ``ready``
    says whether it finished, ``take`` collects it. ``close`` cancels a pending read and closes
    ``items``."""

    def __init__(self, items: AsyncIterator[_T]) -> None:
        self._items = items
        self._step: asyncio.Future[_T] | None = None

    def next(self) -> asyncio.Future[_T]:
        if self._step is None:
            self._step = asyncio.ensure_future(anext(self._items))
        return self._step

    def ready(self) -> bool:
        return self._step is not None and self._step.done()

    def take(self) -> _T:
        """The finished read's item; raises what the read raised, ``Ended`` at the end."""
        step, self._step = self._step, None
        assert step is not None
        assert step.done()
        try:
            return step.result()
        except StopAsyncIteration:
            raise Ended from None

    async def close(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
        await close_quietly(self._items)


async def close_quietly(items: AsyncIterator[Any]) -> None:
    """Close ``items`` where it can be closed, whatever its closing raises."""
    closing = getattr(items, "aclose", None)
    if closing is not None:
        with contextlib.suppress(Exception):
            await closing()


async def wait_any(steps: Iterable[asyncio.Future[Any]], events: Iterable[asyncio.Event],
                   within: float | None) -> None:
    """Return once one of ``steps`` is done or one of ``events`` is set, or after ``within``
    seconds (None: no bound). ``steps`` are left as they are, done or pending."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait([*steps, *waits], timeout=within,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def any_of(*events: asyncio.Event, within: float) -> None:
    """Return once one of ``events`` is set, or after ``within`` seconds."""
    await wait_any((), events, within)
