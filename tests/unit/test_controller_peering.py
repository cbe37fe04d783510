"""Which replica acts: kopf's peering rule, and the gate that follows it without polling."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from controller.engine.peering import ActiveGate, is_active

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
#: Generous bound for a timer-driven takeover in a test (a failure, not a measurement).
TAKEOVER_DEADLINE_S = 5.0


def _peer(priority: int, *, seen_ago_s: float = 1.0, lifetime: int = 30,
          now: datetime = NOW) -> dict[str, object]:
    seen = (now - timedelta(seconds=seen_ago_s)).isoformat()
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen}


def test_highest_live_priority_is_active() -> None:
    peers = {"me": _peer(10), "other": _peer(5)}
    assert is_active(peers, identity="me", priority=10, now=NOW)
    assert not is_active(peers, identity="other", priority=5, now=NOW)


def test_equal_priority_pauses_like_kopf() -> None:
    peers = {"me": _peer(7), "twin": _peer(7)}
    assert not is_active(peers, identity="me", priority=7, now=NOW)


def test_dead_peer_of_higher_priority_does_not_pause() -> None:
    peers = {"me": _peer(1), "gone": _peer(99, seen_ago_s=60, lifetime=30)}
    assert is_active(peers, identity="me", priority=1, now=NOW)


def test_garbage_entries_are_not_peers() -> None:
    peers = {"me": _peer(1), "junk": "not a peer", "bad": {"priority": "high"}}
    assert is_active(peers, identity="me", priority=1, now=NOW)


def _gate(activated: list[str], *, standalone: bool = False) -> ActiveGate:
    return ActiveGate(identity="me", priority=1, clusterwide=False, standalone=standalone,
                      on_active=activated.append)


async def test_standby_acts_when_the_active_peers_entry_expires() -> None:
    activated: list[str] = []
    became_active = asyncio.Event()

    def on_active(where: str) -> None:
        activated.append(where)
        became_active.set()

    gate = ActiveGate(identity="me", priority=1, clusterwide=False, standalone=False,
                      on_active=on_active)
    now = datetime.now(UTC)
    # The active peer was last seen almost a lifetime ago and never comes back.
    gate.put("ns", None, {"me": _peer(1, now=now), "active": _peer(9, seen_ago_s=4.7,
                                                                    lifetime=5, now=now)})
    assert not gate.active("ns")
    assert activated == []
    await asyncio.wait_for(became_active.wait(), TAKEOVER_DEADLINE_S)
    assert gate.active("ns")
    assert activated == ["ns"]
    gate.close()


def test_a_peer_that_leaves_cleanly_hands_over_at_once() -> None:
    activated: list[str] = []
    gate = _gate(activated)
    asyncio.run(_leave(gate))
    assert activated == ["ns"]


async def _leave(gate: ActiveGate) -> None:
    now = datetime.now(UTC)
    gate.put("ns", None, {"active": _peer(9, now=now)})
    assert not gate.active("ns")
    gate.put("ns", None, {"me": _peer(1, now=now)})  # kopf removes a stopping peer's entry
    assert gate.active("ns")
    gate.close()


def test_no_peering_object_means_paused_and_standalone_always_acts() -> None:
    assert not _gate([]).active("ns")
    assert _gate([], standalone=True).active("ns")
