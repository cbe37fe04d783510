"""The resync loop's peering rule, routine Events gathered, and no handler needing a finalizer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from controller.converge import Reconciler
from controller.eventbatch import EventBatcher, summary
from controller.handlers import register
from controller.kube import Kube
from controller.resync import is_active
from controller.settings import ControllerSettings

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _peer(priority: int, *, seen_ago_s: float = 1.0, lifetime: int = 30) -> dict[str, object]:
    seen = (NOW - timedelta(seconds=seen_ago_s)).isoformat()
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


def test_no_handler_needs_a_finalizer() -> None:
    registry = kopf.OperatorRegistry()
    settings = ControllerSettings(namespaces=("a",))
    reconciler = Reconciler(kube=Kube(client=None), settings=settings,  # type: ignore[arg-type]
                            events=lambda *_a, **_k: None)
    register(registry, reconciler)
    assert not registry._spawning.get_all_handlers(), "timers/daemons need a finalizer"
    changing = registry._changing.get_all_handlers()
    assert not [h for h in changing if h.requires_finalizer], "a non-optional delete handler"


def test_routine_events_name_one_object_and_count_many() -> None:
    assert summary("created", "Pod", ["a"], "") == "created pod a"
    assert summary("deleted", "Pod", ["a"], "gone") == "deleted pod a: gone"
    many = summary("created", "Pod", [f"p{i}" for i in range(7)], "")
    assert many == "created 7 pods: p0, p1, p2, p3, p4 and 2 more"


async def test_routine_events_in_one_window_become_one_event() -> None:
    posted: list[tuple[str, str]] = []
    done = asyncio.Event()

    def sink(body: Mapping[str, Any], *, warning: bool, reason: str, message: str) -> None:
        posted.append((reason, message))
        done.set()

    batcher = EventBatcher(sink, window_s=0.01)
    body = {"metadata": {"namespace": "ns", "name": "cfg"}}
    for name in ("a", "b", "c"):
        batcher.routine(body, reason="PodCreated", verb="created", kind="Pod", name=name)
    await asyncio.wait_for(done.wait(), timeout=5)
    assert posted == [("PodCreated", "created 3 pods: a, b, c")]
