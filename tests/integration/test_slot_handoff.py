"""A slot another node waits for is freed by the awaited sweep, not the holder's slow cadence.

Two nodes (the kubelet's own device manager, or the emulator under ``EDGEPLUG_KUBELET=emulator``)
share one Instance of capacity 2, both slots held by pods on node a; a pod pinned to node b
waits Pending. When one of a's pods is deleted, a's agent must notice at its next sweep that the
pod has left pod-resources, free the slot, and give the reservation back, so b's pod gets it.
The holder sweeps every ``settings.slots.sweep_s`` while it holds a slot, and every
``settings.slots.sweep_awaited_s`` while another node's pods wait for it
(``agent.deviceplugins.slots.freeing``). Here ``settings.slots.sweep_s`` is an hour: the hand-off
can only happen through the awaited sweep (nothing else wakes a's agent after the delete), so
without it b's pod would wait for the hour. (How fast the hand-off is goes in
``tests/bench/bench_faults.py``, never in a test.)

A pod that ends moments after its claim hands its slot on as quickly: once a sweep has seen the
slot held by the live pod, the pod's end frees it at the next sweep, whatever the claim's age.
The orphan grace (an hour here) is only for slots no sweep saw held, or claimed again since.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.kubelet.podresources import PodResourcesClient
from agent.settings import SlotSettings, current, in_use
from tests.harness.agent_nodes import (
    StartNode,
    create_instance,
    node_device,
    pinned_pod,
    read_instance,
    share_instance,
)
from tests.harness.kube_waits import running, unschedulable, wait_allocatable, wait_pod, wait_until
from tests.integration.test_slot_demand import hand_over

pytestmark = pytest.mark.timeout(180)

#: The holder's regular sweep cadence in this test: longer than the test itself.
HOUR_S = 3600.0


async def test_a_slot_another_node_waits_for_is_freed_by_the_awaited_sweep(
    kube: AsyncClient,
    pod_namespace: str,
    start_node: StartNode,
) -> None:
    ns = pod_namespace
    with in_use(replace(current(), slots=SlotSettings(sweep_s=HOUR_S))):
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


async def test_a_young_claim_whose_pod_ends_is_freed_without_the_orphan_grace(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
) -> None:
    ns, configuration = pod_namespace, f"young{uuid.uuid4().hex[:6]}"
    node = await start_node(orphan_grace=HOUR_S)
    name = await create_instance(kube, ns, configuration=configuration, digest="f6f6f6",
                                 nodes=[node.name], capacity=1)
    await node.table.put(node_device(ns, configuration, name))
    resource = f"edgeplug.io/{name}"
    await wait_allocatable(kube, node.name, resource, "1")
    await kube.create(pinned_pod(ns, "young", resource=resource, node=node.name,
                                 stop_at_once=True))
    await wait_pod(kube, ns, "young", running, "Running")
    slot = f"{name}-0"

    async def recorded() -> bool:
        return (await read_instance(kube, ns, name)).spec.device_usage.get(slot) == node.name

    await wait_until(recorded, what=f"{slot} recorded for {node.name}")
    socket = node.emulator.pod_resources_socket
    assert socket is not None
    pod_resources = PodResourcesClient(socket)
    try:
        async def listed() -> bool:
            return slot in (await pod_resources.devices_in_use()).get(resource, frozenset())

        await wait_until(listed, what=f"pod-resources listing {slot} held by a live pod")
    finally:
        await pod_resources.close()
    # Two sweeps end after that: the second asked pod-resources after it listed the pod.
    sweeps = node.counter("edgeplug_pod_resources_lists_total", outcome="ok")

    async def swept_twice() -> bool:
        return node.counter("edgeplug_pod_resources_lists_total", outcome="ok") >= sweeps + 2

    await wait_until(swept_twice, what="two more pod-resources sweeps")
    await kube.delete(Pod, "young", namespace=ns)

    async def freed() -> bool:
        return (await read_instance(kube, ns, name)).spec.device_usage.get(slot) == ""

    await wait_until(freed, what=f"{slot} freed once its young pod went (orphan grace: an hour)")
