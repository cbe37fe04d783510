"""One periodic resync of every Configuration, instead of a kopf timer per Configuration.

Why this exists: watch events make the controller react at once, but backoffs, grace periods,
node health and retries after API errors need a periodic pass. A kopf timer per object would do
it, but kopf guards every timer with a finalizer, and a finalizer left on a Configuration makes
its deletion hang forever once the controller is uninstalled or down. So one background loop
walks the Configurations kopf's indices hold, every ``resync_interval_s``.

The loop is started by kopf's first handler call (so after every index holds its initial
listing: nothing is planned from a half-filled view), and resyncs, with peering, only in
namespaces where this replica is the active one: kopf pauses a standby's handlers, but not a
loop of ours, so the loop reads the peering object itself and applies kopf's rule (another live
peer of higher or equal priority pauses this one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from controller.converge import Reconciler
from controller.view import ClusterView

log = logging.getLogger(__name__)

#: kopf's default lifetime of a peer entry when the entry does not say.
DEFAULT_PEER_LIFETIME_S: Final = 60


class PeeringReader(Protocol):
    async def __call__(self, namespace: str | None) -> Mapping[str, Any] | None: ...


def _parse(stamp: object) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def is_active(
    peers: Mapping[str, Any], *, identity: str, priority: int, now: datetime
) -> bool:
    """kopf's rule: paused while another live peer has a higher or the same priority."""
    for peer, info in peers.items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        lastseen = _parse(info.get("lastseen"))
        lifetime = timedelta(seconds=int(info.get("lifetime", DEFAULT_PEER_LIFETIME_S)))
        if lastseen is not None and lastseen + lifetime <= now:
            continue  # dead
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


class Peering:
    """Whether this replica is the active one in a namespace (or cluster-wide)."""

    def __init__(
        self, *, read: PeeringReader, identity: str, priority: int, clusterwide: bool
    ) -> None:
        self._read = read
        self.identity = identity
        self.priority = priority
        self.clusterwide = clusterwide

    async def active(self, namespace: str) -> bool:
        body = await self._read(None if self.clusterwide else namespace)
        if body is None:
            return False  # no peering object: kopf does not run handlers there either
        peers = body.get("status") or {}
        return is_active(
            peers, identity=self.identity, priority=self.priority, now=datetime.now(UTC)
        )


class Resync:
    """The loop: every ``interval_s``, a full pass over each Configuration."""

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        view: Callable[[], ClusterView],
        configurations: Callable[[], Iterable[tuple[str, str]]],
        peering: Peering | None,
        interval_s: float,
    ) -> None:
        self._reconciler = reconciler
        self._view = view
        self._configurations = configurations
        self._peering = peering
        self._interval_s = interval_s

    async def _active(self, namespace: str, known: dict[str, bool]) -> bool:
        if self._peering is None:
            return True
        if namespace not in known:
            try:
                known[namespace] = await self._peering.active(namespace)
            except Exception as error:  # the API is down: skip this pass, not the loop
                log.warning("resync: peering in %s not read: %s", namespace, error)
                known[namespace] = False
        return known[namespace]

    async def once(self) -> None:
        """One pass over every Configuration this replica is active for."""
        view, known = self._view(), dict[str, bool]()
        for namespace, name in sorted(self._configurations()):
            if not await self._active(namespace, known):
                continue
            try:
                await self._reconciler.configuration(view, namespace, name)
            except Exception as error:  # one Configuration must not stop the others
                log.warning("resync of Configuration %s/%s failed: %s", namespace, name, error)

    async def run(self) -> None:
        """Runs until cancelled; start it once kopf's indices hold their initial listing."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.once()
