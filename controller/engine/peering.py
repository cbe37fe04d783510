"""Which replica acts: kopf's peering rule, read from the peering objects a watch keeps.

``ActiveGate.active`` says whether this replica may write; ``is_active`` and ``blocking_peers``
apply the rule (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from controller.settings import PeeringSettings

log = logging.getLogger(__name__)

#: kopf's default lifetime of a peer entry when the entry does not say.
DEFAULT_PEER_LIFETIME_S: Final = 60
#: The key for a ClusterKopfPeering (cluster-wide controller).
CLUSTER: Final = ""


def _parse(stamp: object) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _deadline(info: Mapping[str, Any]) -> datetime | None:
    lastseen = _parse(info.get("lastseen"))
    if lastseen is None:
        return None
    try:
        lifetime = int(info.get("lifetime", DEFAULT_PEER_LIFETIME_S))
    except (TypeError, ValueError):
        lifetime = DEFAULT_PEER_LIFETIME_S
    return lastseen + timedelta(seconds=lifetime)


def blocking_peers(
    peers: Mapping[str, Any], *, identity: str, priority: int, now: datetime
) -> dict[str, datetime | None]:
    """Live peers that pause this one (higher or equal priority), with when each expires."""
    found: dict[str, datetime | None] = {}
    for peer, info in peers.items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        deadline = _deadline(info)
        if deadline is not None and deadline <= now:
            continue  # dead
        try:
            their = int(info.get("priority", 0))
        except (TypeError, ValueError):
            continue  # garbage from someone else: not a peer of ours
        if their >= priority:
            found[peer] = deadline
    return found


def is_active(
    peers: Mapping[str, Any], *, identity: str, priority: int, now: datetime
) -> bool:
    """kopf's rule: paused while another live peer has a higher or the same priority."""
    return not blocking_peers(peers, identity=identity, priority=priority, now=now)


class ActiveGate:
    """Whether this replica is the active one, per namespace (or cluster-wide).

    ``put`` is the peering watch's change callback; ``on_active(namespace)`` is called when this
    replica becomes active there (``CLUSTER`` cluster-wide), so the caller can reconcile all.
    Without peering (``standalone``) it is always active.
    """

    def __init__(
        self, *, identity: str, priority: int, clusterwide: bool, standalone: bool,
        on_active: Callable[[str], None], expiry_margin_s: float = PeeringSettings.expiry_margin_s,
    ) -> None:
        self.identity = identity
        self.expiry_margin_s = expiry_margin_s
        self.priority = priority
        self.clusterwide = clusterwide
        self.standalone = standalone
        self.on_active = on_active
        self._peers: dict[str, Mapping[str, Any]] = {}
        self._active: dict[str, bool] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def active(self, namespace: str) -> bool:
        if self.standalone:
            return True
        return self._active.get(CLUSTER if self.clusterwide else namespace, False)

    def put(self, key: str, _old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        if new is None:
            self._peers.pop(key, None)
        else:
            self._peers[key] = new
        self._evaluate(key)

    def _evaluate(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        peers = self._peers.get(key)
        now = datetime.now(UTC)
        # No peering object: kopf itself pauses (mandatory peering), so this replica waits.
        blockers = (
            blocking_peers(peers, identity=self.identity, priority=self.priority, now=now)
            if peers is not None else None
        )
        active = blockers is not None and not blockers
        if blockers:
            expiries = [d for d in blockers.values() if d is not None]
            if expiries:
                delay = (min(expiries) - now).total_seconds() + self.expiry_margin_s
                loop = asyncio.get_running_loop()
                self._timers[key] = loop.call_later(max(delay, 0.0), self._evaluate, key)
        was = self._active.get(key, False)
        self._active[key] = active
        where = "cluster-wide" if key == CLUSTER else f"in namespace {key}"
        if active and not was:
            log.info("active %s (priority %d)", where, self.priority)
            self.on_active(key)
        elif was and not active:
            log.info("paused %s in favour of %s", where, sorted(blockers or ()))

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
