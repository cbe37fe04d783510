"""Pods taking turns on a device's slots: delete a running one, wait for a waiting one to run.

The race and the unlabelled-pinned-pods scenarios both create more pinned pods
than a shared device has slots and then, one deletion at a time, require that every slot is in
use again (a waiting pod took the one freed last) and never more than the slots, until every
pod has run. ``take_turns`` is that loop, once; it returns each hand-off's time (deletion →
every slot in use again) for the scenario to print, never to assert.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from tests.faults.cluster import delete_pod
from tests.harness.kube_waits import wait_until


async def running_pods(client: AsyncClient, namespace: str) -> set[str]:
    return {p.metadata.name or "" async for p in client.list(Pod, namespace=namespace)
            if p.metadata is not None and p.metadata.deletionTimestamp is None
            and p.status is not None and p.status.phase == "Running"}


async def take_turns(
    client: AsyncClient, namespace: str, names: Collection[str], *, capacity: int,
    victim: Callable[[set[str], int], str],
) -> tuple[list[str], list[float]]:
    """Delete ``victim(running, deleted so far)`` each turn until every pod has run; then
    delete the rest. Returns the deleted pods in order and each turn's hand-off seconds."""
    loop = asyncio.get_running_loop()
    ran: set[str] = set()
    deleted: list[str] = []
    handoffs: list[float] = []
    since = loop.time()
    while True:
        want = min(capacity, len(names) - len(deleted))
        now: set[str] = set()

        async def all_slots_used(want: int = want, now: set[str] = now) -> bool:
            now.clear()
            now.update(await running_pods(client, namespace))
            assert len(now) <= capacity, f"more pods run than the device has slots: {now}"
            return len(now) == want

        await wait_until(all_slots_used, what=f"{want} pods running after "
                                              f"{len(deleted)} deleted ({deleted})")
        if deleted:
            handoffs.append(loop.time() - since)
        ran |= now
        if ran == set(names):
            break
        chosen = victim(now, len(deleted))
        since = loop.time()
        await delete_pod(client, namespace, chosen)
        deleted.append(chosen)
    for name in set(names) - set(deleted):
        await delete_pod(client, namespace, name)
    return deleted, handoffs
