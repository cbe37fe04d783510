"""A queue of things to reconcile: each key once, one worker per key, some of them later.

``WorkQueue.add``, ``add_after`` (a deadline) and ``work`` (a worker loop). Why:
docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from controller.settings import EngineSettings

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)



class WorkQueue(Generic[K]):
    """Deduplicating work queue with delayed adds and per-key retry backoff."""

    def __init__(self, *, retry_first_s: float = EngineSettings.queue_retry_first_s,
                 retry_max_s: float = EngineSettings.queue_retry_max_s) -> None:
        #: A key whose reconcile failed runs again after this long, doubling per failure.
        self.retry_first_s = retry_first_s
        self.retry_max_s = retry_max_s
        self._order: collections.deque[K] = collections.deque()
        self._waiting: set[K] = set()
        self._busy: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._busy

    def add(self, key: K) -> None:
        """Reconcile ``key`` soon (once, however often it is added meanwhile)."""
        if key in self._busy:
            self._again.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._order.append(key)
        self._ready.set()

    def add_after(self, key: K, delay_s: float) -> None:
        """Reconcile ``key`` in ``delay_s`` (an earlier deadline for it wins)."""
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        """Adds ``key`` again after its backoff; returns the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = float(min(self.retry_first_s * 2 ** min(failures - 1, 16), self.retry_max_s))
        self.add_after(key, delay)
        return delay

    def succeeded(self, key: K) -> None:
        self._failures.pop(key, None)

    async def _get(self) -> K:
        while not self._order:
            self._ready.clear()
            await self._ready.wait()
        key = self._order.popleft()
        self._waiting.discard(key)
        self._busy.add(key)
        return key

    def _done(self, key: K) -> None:
        self._busy.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    async def work(self, handle: Callable[[K], Awaitable[None]]) -> None:
        """One worker: runs ``handle`` for each key until cancelled; a failure retries the key
        with backoff and never stops the worker."""
        while True:
            key = await self._get()
            try:
                await handle(key)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay = self.retry(key)
                log.warning("reconcile of %s failed (%s: %s); retrying in %.1fs",
                            key, type(error).__name__, error, delay)
            else:
                self.succeeded(key)
            finally:
                self._done(key)

    def close(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
