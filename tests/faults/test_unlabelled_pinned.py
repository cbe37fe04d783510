"""Users' pods pinned to nodes, with no edgeplug label, get the slots other nodes free.

Pods pinned by hostname alone: two nodes see one shared device of capacity 2 (one slot reserved for
each); six pods pinned by a ``kubernetes.io/hostname`` nodeSelector, three per node, and none
labelled ``edgeplug.io/target-node``. As running pods are deleted the waiting ones must take the
freed slots, whichever node freed them. Before the controller counted pinned pods on the Node
(controller/brokers/pinned_demand.py → the ``edgeplug.io/pinned-demand`` annotation →
agent/deviceplugins/crossnode/demand.py), a slot freed on one node stayed reserved there while the
other node's pod waited: nothing was admitted for 45 s.

Real parts: two kubelets' device managers (``DeviceNode``), an agent process beside each, the
controller process (it writes the annotation; no brokers), the real scheduler. Every invariant
holds throughout (tests/faults/invariants.py). The hand-off times (pod deleted → the waiting
pod Running) are printed, never asserted.
"""

from __future__ import annotations

import statistics

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from crds.naming import instance_resource_name
from crds.pinning import PINNED_DEMAND_ANNOTATION
from tests.faults.cluster import FaultCluster
from tests.faults.slot_turns import take_turns
from tests.harness.agent_nodes import pinned_pod
from tests.harness.kube_waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CAPACITY = 2
PODS_PER_NODE = 3


async def test_unlabelled_pinned_pods_get_slots_freed_on_either_node(
    cluster: FaultCluster, client: AsyncClient
) -> None:
    a, b = await cluster.add_node(), await cluster.add_node()
    cluster.start_controller()
    expected = await cluster.one_shared_device(client, "pinned", capacity=CAPACITY,
                                               brokers=False)
    [instance] = expected
    resource = instance_resource_name(instance)
    ns = cluster.namespace
    names = {f"{node.name}-{i}": node.name for node in (a, b) for i in range(PODS_PER_NODE)}

    async with cluster.recorder() as recorder:
        for name, node in names.items():
            pod = pinned_pod(ns, name, resource=resource, node=node, stop_at_once=True)
            assert pod.metadata is not None
            pod.metadata.labels = {}  # a user's own pod: pinned, not labelled
            await client.create(pod)

        async def counted() -> bool:
            """The controller is up and has counted the waiting pods on both Nodes (its
            start-up, seconds of imports, is not a hand-off)."""
            nodes = [await client.get(Node, n.name) for n in (a, b)]
            return all(PINNED_DEMAND_ANNOTATION in ((n.metadata and n.metadata.annotations)
                                                    or {}) for n in nodes)

        await wait_until(counted, what="the controller's count of pinned pods on both nodes")
        # Empty node a first, so its freed slots must cross to node b's waiting pods.
        deleted, handoffs = await take_turns(
            client, ns, names, capacity=CAPACITY,
            victim=lambda now, _: sorted(now, key=lambda n: (names[n] != a.name, n))[0])
        await cluster.converged(client, expected, brokers=False)
    recorder.assert_clean()
    print(f"hand-offs (pod deleted -> a waiting pod Running), {len(handoffs)}: "
          f"median {statistics.median(handoffs):.2f} s, max {max(handoffs):.2f} s; in order: "
          + ", ".join(f"{v} {t:.2f} s" for v, t in zip(deleted, handoffs, strict=False)))
