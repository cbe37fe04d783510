"""Reservations follow demand: a node whose pinned pods wait gets the idle node's slot.

Two emulated nodes (real gRPC device plugins, the real scheduler placing pods) share one Instance
of capacity 2. Fair share gives each node one slot; pods pinned to one node (as the controller
pins broker pods) must still get both, by the idle node's reservation moving over, and a pod
pinned to the other node must wait Pending, never Failed, until a slot comes free. A watch
records every pod status the API server ever reports, so "never Failed" covers the whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import OnErrorAction, OnErrorResult

from agent.kube.client import InstanceResource, as_dict
from tests.harness.agent_nodes import (
    AgentNode,
    StartNode,
    pinned_pod,
    read_instance,
    share_instance,
)
from tests.harness.kube_waits import running, unschedulable, wait_pod, wait_until
from tests.harness.node_emulator import ADMISSION_ERROR

pytestmark = pytest.mark.timeout(240)

#: Pause before re-opening the failure-recording pod watch after an error.
WATCH_RETRY_S = 0.2


@pytest.fixture
async def failures(kube: AsyncClient, pod_namespace: str) -> AsyncIterator[list[str]]:
    """Every Failed or admission-rejected pod status seen in the namespace, as it happens."""
    seen: list[str] = []

    def on_error(error: Exception, count: int) -> OnErrorResult:
        return OnErrorResult(OnErrorAction.RETRY, sleep=WATCH_RETRY_S)

    async def record() -> None:
        async for _, pod in kube.watch(Pod, namespace=pod_namespace, on_error=on_error):
            status = pod.status
            if status is not None and (
                status.phase == "Failed" or status.reason == ADMISSION_ERROR
            ):
                name = pod.metadata.name if pod.metadata else "?"
                seen.append(f"{name}: {status.phase} {status.reason} {status.message}")

    task = asyncio.create_task(record())
    yield seen
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def demand_of(kube: AsyncClient, namespace: str, name: str) -> dict[str, int]:
    obj = as_dict(await kube.get(InstanceResource, name, namespace=namespace))
    return dict((obj.get("status") or {}).get("demand") or {})


def assert_quiet(nodes: tuple[AgentNode, ...], namespace: str, configuration: str,
                 failures: list[str]) -> None:
    """No pod failed, no Allocate of the Configuration's Instance resources was refused and no
    slot claim lost, on any node; some were answered (the counters are the ones read)."""
    assert failures == [], f"pods failed: {failures}"
    for node in nodes:
        assert node.slot_conflicts(namespace, configuration) == 0
        refused = node.allocations(namespace, configuration, outcome="refused")
        assert refused == 0, f"{node.name} refused {refused} Allocate calls"
    assert sum(node.allocations(namespace, configuration) for node in nodes) > 0


async def fill_from(
    kube: AsyncClient, ns: str, name: str, resource: str, a: AgentNode
) -> set[str]:
    """Two pods that can only run on ``a`` (pinned both ways the controller pins), Running
    there; returns the slots a's kubelet holds for them: both of the Instance's."""
    await kube.create(pinned_pod(ns, "a-1", resource=resource, node=a.name, by_affinity=True))
    await kube.create(pinned_pod(ns, "a-2", resource=resource, node=a.name, by_affinity=False))
    for pod in ("a-1", "a-2"):
        placed = await wait_pod(kube, ns, pod, running, "Running")
        assert placed.spec is not None
        assert placed.spec.nodeName == a.name
    held_a = a.emulator.allocated_device_ids(resource)
    assert held_a == {f"{name}-0", f"{name}-1"}, f"a's kubelet holds {held_a}"
    return held_a


async def hand_over(
    kube: AsyncClient, ns: str, resource: str, a: AgentNode, b: AgentNode
) -> tuple[str, set[str], set[str]]:
    """a's pod a-1 goes; b's waiting pod b-1 must run on b with the very slot a-1 freed, and
    no slot may be held on both nodes. Returns that slot, and what a's and b's kubelets hold."""
    freed = a.emulator.allocations(ns, "a-1")[0].device_ids[0]
    await kube.delete(Pod, "a-1", namespace=ns)
    placed = await wait_pod(kube, ns, "b-1", running, "Running")
    assert placed.spec is not None
    assert placed.spec.nodeName == b.name
    held_a, held_b = (n.emulator.allocated_device_ids(resource) for n in (a, b))
    assert held_b == {freed}, f"b's kubelet holds {held_b}, expected the freed slot {freed}"
    assert not held_a & held_b, "one slot handed out on both nodes"
    return freed, held_a, held_b


async def test_reservations_move_to_the_node_whose_pinned_pods_wait(
    kube: AsyncClient,
    pod_namespace: str,
    start_node: StartNode,
    failures: list[str],
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    a, b = await start_node(), await start_node()
    # Fair share: one reserved slot each.
    name, resource = await share_instance(
        kube, ns, configuration=configuration, digest="f6f6f6", nodes=(a, b), capacity=2
    )
    # The agents keep the display field `kubectl get instances -o wide` prints: nodes sorted.
    async def nodes_shown() -> bool:
        obj = as_dict(await kube.get(InstanceResource, name, namespace=ns))
        return bool((obj.get("status") or {}).get("nodes") == ",".join(sorted((a.name, b.name))))

    await wait_until(nodes_shown, what="status.nodes: both nodes, sorted")

    # Two pods that can only run on a: the second needs b's idle slot.
    held_a = await fill_from(kube, ns, name, resource, a)
    assert b.emulator.allocated_device_ids(resource) == set()
    # A slot reserved for a is answered at once and recorded right after (the fast path).
    async def recorded() -> bool:
        instance = await read_instance(kube, ns, name)
        return instance.spec.device_usage == dict.fromkeys(held_a, a.name)

    await wait_until(recorded, what="deviceUsage agreeing with what the kubelets allocated")
    instance = await read_instance(kube, ns, name)
    assert instance.reservations == dict.fromkeys(held_a, a.name)

    async def demand_met() -> bool:
        return await demand_of(kube, ns, name) == {}

    await wait_until(demand_met, what=f"status.demand of {name} cleared once a's pods run")
    assert_quiet((a, b), ns, configuration, failures)

    # A pod pinned to b waits Pending (not Failed) while a uses both slots, and says so.
    await kube.create(pinned_pod(ns, "b-1", resource=resource, node=b.name, by_affinity=False))
    waiting = await wait_pod(kube, ns, "b-1", unschedulable, "Unschedulable")
    assert waiting.status is not None
    assert waiting.status.phase == "Pending"

    async def b_demands() -> bool:
        return await demand_of(kube, ns, name) == {b.name: 1}

    await wait_until(b_demands, what=f"status.demand of {name} = {{{b.name}: 1}}")
    still = await kube.get(Pod, "b-1", namespace=ns)
    assert still.status is not None
    assert still.status.phase == "Pending"
    assert_quiet((a, b), ns, configuration, failures)

    # A pod on a goes: its slot is freed, a gives the reservation back, b's pod gets it.
    _, held_a, held_b = await hand_over(kube, ns, resource, a, b)
    usage = (await read_instance(kube, ns, name)).spec.device_usage
    assert usage == {**dict.fromkeys(held_a, a.name), **dict.fromkeys(held_b, b.name)}, (
        "deviceUsage disagrees with what the kubelets allocated"
    )
    await wait_until(demand_met, what=f"status.demand of {name} cleared once b's pod runs")
    assert_quiet((a, b), ns, configuration, failures)
