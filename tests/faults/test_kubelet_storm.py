"""Twenty kubelet restarts while pods come and go on the node.

Real parts: the kubelet's device manager (``DeviceNode``: each restart ends the process, keeps
its checkpoint and running containers, and deletes every plugin socket, as the kubelet does),
the agent as a process, the controller as a process. Pods asking for the Instance's resource
are created, run and deleted without pause the whole time; every invariant holds throughout
(tests/faults/invariants.py), and the state converges once the storm ends.

A restart never strikes while a pod is being admitted, nor is a pod created before the restarted
kubelet has the agent's plugin registered again: the kubelet itself fails a pod it admits in
that window ("Allocate failed due to no healthy devices present", UnexpectedAdmissionError;
kubernetes/kubernetes#133382, the hard reject of #109595), whatever the plugin does. Restarts
do strike while pods run on their slots and while deleted pods' slots are being freed.
"""

from __future__ import annotations

import pytest
from lightkube import AsyncClient

from crds.naming import instance_resource_name
from tests.faults.churn import PodChurn
from tests.faults.cluster import FaultCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RESTARTS = 20
#: How long one restarted kubelet may take to see the agent's plugin registered again.
REREGISTER_S = 30.0
CAPACITY = 3


async def test_kubelet_restart_storm_while_pods_churn(
    load: str, cluster: FaultCluster, client: AsyncClient
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    node = await cluster.add_node()
    cluster.start_controller()
    expected = await cluster.one_shared_device(client, "storm", capacity=CAPACITY, brokers=True)
    [instance] = expected
    resource = instance_resource_name(instance)

    churn = PodChurn(client, cluster.namespace, node.name, resource, prefix="churn")
    async with cluster.recorder() as recorder:
        churn.start()
        try:
            for _ in range(RESTARTS):
                async with churn.admitting:
                    seen = len(node.kubelet.registrations)
                    await node.kubelet.restart_kubelet()
                    await node.kubelet.wait_for(
                        lambda seen=seen: resource in {  # type: ignore[misc]
                            r.resource_name for r in node.kubelet.registrations[seen:]}
                        and len(node.kubelet.healthy_device_ids(resource)) == CAPACITY,
                        timeout=REREGISTER_S, what=f"{resource} registered again, its slots "
                                                   "advertised healthy")
            await churn.stop()
        finally:
            await churn.cancel()
        await cluster.converged(client, expected, brokers=True)
    recorder.assert_clean()
    assert churn.ran > 0, "no pod ran during the storm"
    print(f"{churn.ran} pods ran and were deleted during {RESTARTS} kubelet restarts")
