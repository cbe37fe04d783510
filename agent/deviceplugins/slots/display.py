"""The two Instance fields only people read: ``status.used`` and ``status.nodes``.

``kubectl get instances`` prints how many slots are held and, with ``-o wide``, the sorted nodes
that see the device. Nothing decides on them, so they follow ``deviceUsage`` and ``nodes``
lazily: ``settings.slots.display_delay_s`` after a change first made them stale, one write per stale
Instance, conditioned on the object they were computed from (a lost race is left to the next
change or resync), so they neither load the API server nor conflict with claims.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent.deviceplugins.slots.ledger import SlotLedger
from agent.kube import watching
from agent.settings import current
from crds.instance import Instance

log = logging.getLogger(__name__)


_Key = tuple[str, str]  # (namespace, Instance name)


def shown(instance: Instance) -> tuple[int, str]:
    """``status.used`` and ``status.nodes`` as they should read."""
    return instance.spec.used, instance.spec.nodes_shown


class DisplayFields:
    """Keeps the display fields of the Instances this node serves in line, lazily."""

    def __init__(
        self,
        *,
        ledger: Callable[[str, str], SlotLedger],
        served: Callable[[], Iterable[tuple[_Key, Instance]]],
    ) -> None:
        self._ledger = ledger
        self._served = served
        self._seen: dict[_Key, object] = {}  # (status.used, status.nodes) as last seen
        self._writer: asyncio.Task[None] | None = None

    def seen(self, key: _Key, status: Mapping[str, Any]) -> None:
        """What the Instance's latest watch event says the fields are."""
        self._seen[key] = (status.get("used"), status.get("nodes"))

    def forget(self, key: _Key) -> None:
        self._seen.pop(key, None)

    def correct(self, served: Mapping[_Key, Instance]) -> None:
        """Schedule one write pass if any served Instance's fields are stale."""
        stale = any(self._seen.get(k) != shown(i) for k, i in served.items())
        if stale and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self._write_later(), name="status-display")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_later(self) -> None:
        await asyncio.sleep(current().slots.display_delay_s)
        for key, instance in list(self._served()):
            if self._seen.get(key) != shown(instance):
                try:
                    await self._ledger(*key).write_used(instance)
                except Exception as error:  # the next change or resync writes it again
                    log.info("status.used of %s/%s not written (%s)", *key,
                             watching.describe(error))
