"""A slot another node waits for is freed by the awaited sweep, not the holder's slow cadence.

Two nodes (the kubelet's own device manager, or the emulator under ``EDGEPLUG_KUBELET=emulator``)
share one Instance of capacity 2, both slots held by pods on node a; a pod pinned to node b
waits Pending. When one of a's pods is deleted, a's agent must notice at its next sweep that the
pod has left pod-resources, free the slot, and give the reservation back, so b's pod gets it.
The holder sweeps every ``SWEEP_SECONDS`` while it holds a slot, and every
``SWEEP_AWAITED_SECONDS`` while another node's pods wait for it (``agent.slots.freeing``). Here
``SWEEP_SECONDS`` is an hour: the hand-off can only happen through the awaited sweep (nothing
else wakes a's agent after the delete), so without it b's pod would wait for the hour.
(How fast the hand-off is goes in ``tests/bench/bench_faults.py``, never in a test.)
"""

from __future__ import annotations

import pytest
from lightkube import AsyncClient

from agent.slots import service
from tests.harness.agent_nodes import StartNode, pinned_pod, read_instance, share_instance
from tests.harness.kube_waits import running, unschedulable, wait_pod, wait_until
from tests.integration.test_slot_demand import hand_over

pytestmark = pytest.mark.timeout(180)

#: The holder's regular sweep cadence in this test: longer than the test itself.
HOUR_S = 3600.0


async def test_a_slot_another_node_waits_for_is_freed_by_the_awaited_sweep(
    kube: AsyncClient,
    pod_namespace: str,
    start_node: StartNode,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "SWEEP_SECONDS", HOUR_S)
    ns = pod_namespace
    a, b = await start_node(), await start_node()
    name, resource = await share_instance(
        kube, ns, configuration="handoff", digest="a0a0a0", nodes=(a, b), capacity=2
    )
    for pod in ("a-1", "a-2"):
        await kube.create(pinned_pod(ns, pod, resource=resource, node=a.name))
        await wait_pod(kube, ns, pod, running, "Running")
    assert a.emulator.allocated_device_ids(resource) == {f"{name}-0", f"{name}-1"}

    await kube.create(pinned_pod(ns, "b-1", resource=resource, node=b.name))
    await wait_pod(kube, ns, "b-1", unschedulable, "Unschedulable")

    async def b_demands() -> bool:
        return (await read_instance(kube, ns, name)).demand == {b.name: 1}

    await wait_until(b_demands, what=f"status.demand of {name} = {{{b.name}: 1}}")

    freed, held_a, held_b = await hand_over(kube, ns, resource, a, b)

    async def recorded() -> bool:
        usage = (await read_instance(kube, ns, name)).spec.device_usage
        return usage == {**dict.fromkeys(held_a, a.name), **dict.fromkeys(held_b, b.name)}

    await wait_until(recorded, what="deviceUsage matching what the kubelets allocated")
    instance = await read_instance(kube, ns, name)
    assert instance.reservations.get(freed) == b.name
    assert instance.demand == {}
