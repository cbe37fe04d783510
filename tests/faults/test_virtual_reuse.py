"""Configuration-level device ids re-used under churn, kubelet restarts and agent kills.

A virtual id handed on at once: a pod on the Configuration resource (``edgeplug.io/reuse``) leaves,
the kubelet hands its virtual id to the next pod at once, and the agent maps it onto the slot
the id still holds. An orphan sweep whose pod-resources ``List`` was asked just before that
``Allocate`` then freed the slot (same ``deviceUsage`` value as the departed pod's), and the
Instance plugin gave it to a second pod: a device of capacity 2 served three live containers.

Real parts: the kubelet's device manager (``DeviceNode``: its checkpoint, its re-use of freed
device ids, its pod-resources ``List``), the agent as a process (SIGKILLed and restarted), the
controller as a process, the real scheduler. Three shared debugEcho devices of capacity 2: the
controller's three brokers take one slot each (the Instances' own resources); three churns on the
Configuration resource keep the other three in use, pod after pod, while the kubelet restarts and
the agent is killed in turn, so a freed virtual id is handed out again at once and a slot freed by
mistake is taken by the next id. (No churn on an Instance's own resource beside them: the scheduler
counts the two resources apart though they share slots, and admits a pod on one that the other has
just used up; agent/deviceplugins/slots/rules.py, "two resources, one slot".) The recorder judges
double use by what each live container got from ``Allocate`` (the Instance hash in its environment;
tests/faults/invariants.py), which a wrong free cannot hide.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient

from crds.naming import configuration_resource_name, instance_resource_name
from tests.faults.churn import PodChurn
from tests.faults.cluster import FaultCluster, FaultNode
from tests.faults.test_agent_kills import serving_again
from tests.harness.kube_waits import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

DEVICES = ("cam0", "cam1", "cam2")
CAPACITY = 2
#: Pods on the Configuration resource at once: with the three brokers, every slot is in use.
CHURNS = 3
#: Faults in all: even rounds restart the kubelet, odd ones kill the agent.
ROUNDS = 8
#: Pods each churn must have run between two faults (so ids are re-used in every interval).
PODS_BETWEEN_FAULTS = 2
#: How long the churns may take to run those pods (a loaded 2-core machine).
CHURN_S = 120.0


@contextlib.asynccontextmanager
async def no_admission_in_flight(churns: list[PodChurn]) -> AsyncIterator[None]:
    """Hold every churn's ``admitting`` lock: no pod is being admitted while a fault strikes
    (the kubelet itself fails such a pod, whatever the plugin does: test_kubelet_storm.py)."""
    async with contextlib.AsyncExitStack() as stack:
        for churn in churns:
            await stack.enter_async_context(churn.admitting)
        yield


async def strike(node: FaultNode, round_: int, resources: tuple[str, ...]) -> None:
    since = len(node.kubelet.registrations)
    if round_ % 2 == 0:
        await node.kubelet.restart_kubelet()
    else:
        node.restart_agent()
    await serving_again(node, since, resources)


async def test_virtual_ids_reused_under_churn_restarts_and_kills(
    cluster: FaultCluster, client: AsyncClient
) -> None:
    node = await cluster.add_node()
    cluster.start_controller()
    cluster.configure("reuse", descriptions=DEVICES, availability=cluster.workdir / "offline",
                      capacity=CAPACITY, grace=5, brokers=True)
    expected = cluster.expected("reuse", DEVICES)
    await cluster.converged(client, expected, brokers=True)
    configuration = configuration_resource_name("reuse", None)
    resources = (configuration, *(instance_resource_name(i) for i in sorted(expected)))
    ns = cluster.namespace
    churns = [PodChurn(client, ns, node.name, configuration, prefix=f"vid-{k}")
              for k in range(CHURNS)]
    async with cluster.recorder() as recorder:
        for churn in churns:
            churn.start()
        try:
            for round_ in range(ROUNDS):
                target = [c.ran + PODS_BETWEEN_FAULTS for c in churns]
                await until(
                    lambda target=target: all(  # type: ignore[misc]
                        c.ran >= t for c, t in zip(churns, target, strict=True)),
                    within=CHURN_S, what=f"{PODS_BETWEEN_FAULTS} pods per churn before fault "
                                         f"{round_}")
                async with no_admission_in_flight(churns):
                    await strike(node, round_, resources)
            for churn in churns:
                await churn.stop()
        finally:
            for churn in churns:
                await churn.cancel()
        await cluster.converged(client, expected, brokers=True)
    recorder.assert_clean()
    ran = sum(c.ran for c in churns)
    print(f"{ran} pods ran and were deleted across {ROUNDS} faults "
          f"({ROUNDS // 2} kubelet restarts, {ROUNDS - ROUNDS // 2} agent kills)")
