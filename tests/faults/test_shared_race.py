"""Two nodes racing for one shared device whose capacity is less than the pods wanting it.

Real parts: two kubelets' device managers (``DeviceNode``), an agent process beside each (both
discover the same shared debugEcho device), the real scheduler. Pods pinned to the two nodes,
twice as many as the device has slots and three to one, are created at once; as running pods
are deleted the waiting ones must get the freed slots, whichever node freed them (the second
node's slot must cross to the first). Throughout, no slot is held by two pods on any
node, no pod fails admission (the losing node must never even try a slot the other holds), and
the Instance is never re-created (tests/faults/invariants.py).
"""

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from crds.naming import instance_resource_name
from tests.faults.cluster import FaultCluster, delete_pod
from tests.harness.agent_nodes import pinned_pod
from tests.harness.kube_waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CAPACITY = 2
#: Pods pinned to the first node and to the second: uneven, so that slots must move across.
PODS = (3, 1)


async def running_pods(client: AsyncClient, namespace: str) -> set[str]:
    return {p.metadata.name or "" async for p in client.list(Pod, namespace=namespace)
            if p.metadata is not None and p.metadata.deletionTimestamp is None
            and p.status is not None and p.status.phase == "Running"}


async def test_two_nodes_race_for_one_shared_device(
    load: str, cluster: FaultCluster, client: AsyncClient
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    first, second = await cluster.add_node(), await cluster.add_node()
    expected = await cluster.one_shared_device(client, "race", capacity=CAPACITY, brokers=False)
    [instance] = expected
    resource = instance_resource_name(instance)
    ns = cluster.namespace
    names = [f"{node.name}-{i}" for node, count in zip((first, second), PODS, strict=True)
             for i in range(count)]

    async with cluster.recorder() as recorder:
        for name in names:
            pinned_to = name.rpartition("-")[0]
            await client.create(pinned_pod(
                ns, name, resource=resource, node=pinned_to, stop_at_once=True))
        ran: set[str] = set()
        deleted: list[str] = []
        while True:
            # Every slot in use again (a waiting pod took the one freed last), never more.
            want = min(CAPACITY, len(names) - len(deleted))
            now: set[str] = set()

            async def all_slots_used(want: int = want, now: set[str] = now) -> bool:
                now.clear()
                now.update(await running_pods(client, ns))
                assert len(now) <= CAPACITY, f"more pods run than the device has slots: {now}"
                return len(now) == want

            await wait_until(all_slots_used, what=f"{want} pods running after "
                                                  f"{len(deleted)} deleted ({deleted})")
            ran |= now
            if ran == set(names):
                break
            victim = sorted(now)[len(deleted) % len(now)]
            await delete_pod(client, ns, victim)
            deleted.append(victim)
        for name in set(names) - set(deleted):
            await delete_pod(client, ns, name)
        await cluster.converged(client, expected, brokers=False)
    recorder.assert_clean()
