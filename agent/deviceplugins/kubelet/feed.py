"""What a plugin advertises: device ids with their health, and the feed ``ListAndWatch`` streams.

The slot rules compute advertised lists and must stay free of gRPC; the plugin
lifecycle streams them. This module is the grpc-free meeting point of the two.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class AdvertisedDevice:
    """One device id as the kubelet sees it."""

    id: str
    healthy: bool = True


class DeviceFeed:
    """The advertised device list, with change notification and deduplication.

    ``publish`` is synchronous so device logic can call it from anywhere in the event loop; it
    returns whether the list really changed. ``updates`` yields the current list at once and then
    each distinct list, which is exactly what ``ListAndWatch`` needs.
    """

    def __init__(self, devices: Iterable[AdvertisedDevice] = ()) -> None:
        self._devices: tuple[AdvertisedDevice, ...] = tuple(sorted(devices))
        self._changed = asyncio.Event()

    @property
    def devices(self) -> tuple[AdvertisedDevice, ...]:
        return self._devices

    def publish(self, devices: Iterable[AdvertisedDevice]) -> bool:
        new = tuple(sorted(devices))
        if new == self._devices:
            return False
        self._devices = new
        self.wake()
        return True

    def wake(self) -> None:
        """Wake every reader waiting for a change (they look again; a stream that is ending
        uses this to end without a second waiter of its own)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def updates(
        self, *, until: Callable[[], bool] = lambda: False
    ) -> AsyncGenerator[tuple[AdvertisedDevice, ...], None]:
        """The current list at once, then each distinct list; ends once ``until()`` is true
        (checked whenever the reader wakes: call ``wake`` after making it true)."""
        sent: tuple[AdvertisedDevice, ...] | None = None
        while not until():
            waiter = self._changed
            if self._devices != sent:
                sent = self._devices
                yield sent
                continue
            await waiter.wait()

    def ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self._devices)

    def healthy_ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self._devices if d.healthy)
