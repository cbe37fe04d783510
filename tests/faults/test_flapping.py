"""A shared device flapping 100 times, faster than its grace period: nothing may churn.

Real parts: the kubelet's device manager (``DeviceNode``), the agent as a process (debugEcho
reads the availability file the test rewrites), the controller as a process. While the device
goes offline and back 100 times, its Instance must keep its uid, its broker must stay the same
pod, and every invariant holds (tests/faults/invariants.py); afterwards the node advertises the
Instance's slots healthy again and the state converges.
"""

from __future__ import annotations

import asyncio

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from crds.naming import instance_resource_name
from tests.faults.cluster import FaultCluster
from tests.faults.invariants import is_broker
from tests.harness.agent_nodes import pinned_pod
from tests.harness.kube_waits import running, wait_pod

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLAPS = 100
#: The fault's rhythm: how long the device stays offline, then online, in each flap. Nothing
#: waits on it; it only has to stay well under the grace period.
FLAP_HALF_PERIOD_S = 0.05
GRACE_S = 5
CAPACITY = 2


async def broker_uids(client: AsyncClient, cluster: FaultCluster) -> set[str]:
    return {p.metadata.uid or "" async for p in client.list(Pod, namespace=cluster.namespace)
            if p.metadata is not None and is_broker(p.to_dict())}


async def test_device_flapping_faster_than_its_grace_churns_nothing(
    cluster: FaultCluster, client: AsyncClient
) -> None:
    availability = cluster.workdir / "offline"
    node = await cluster.add_node()
    cluster.start_controller()
    cluster.configure("flap", descriptions=["cam0"], availability=availability,
                      capacity=CAPACITY, grace=GRACE_S, brokers=True)
    expected = cluster.expected("flap", ["cam0"])
    [instance] = expected
    resource = instance_resource_name(instance)
    await cluster.converged(client, expected, brokers=True)
    await client.create(pinned_pod(
        cluster.namespace, "user", resource=resource, node=node.name, stop_at_once=True))
    await wait_pod(client, cluster.namespace, "user", running, "Running")
    await cluster.converged(client, expected, brokers=True)
    brokers = await broker_uids(client, cluster)

    async with cluster.recorder() as recorder:
        flaps_seen = 0  # flaps in which the kubelet saw the device's slots go unhealthy
        for _ in range(FLAPS):
            availability.write_text("cam0\n")
            await asyncio.sleep(FLAP_HALF_PERIOD_S)
            flaps_seen += len(node.kubelet.healthy_device_ids(resource)) < CAPACITY
            availability.write_text("")
            await asyncio.sleep(FLAP_HALF_PERIOD_S)
        assert flaps_seen > 0, "the kubelet never saw the device flap"
        await cluster.converged(client, expected, brokers=True)
        await node.kubelet.wait_for(
            lambda: len(node.kubelet.healthy_device_ids(resource)) == CAPACITY,
            timeout=30.0, what=f"both slots of {resource} advertised healthy again")
    recorder.assert_clean()
    assert await broker_uids(client, cluster) == brokers, "a broker was replaced"
