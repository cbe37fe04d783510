"""The agent's slots across a restart of the real kubelet device manager.

A kubelet restart with running pods holding slots, shown against the kubelet's own device
manager (``DeviceNode``): allocations survive from its checkpoint, Allocate is not called again for
the running pod, and the agent's ``deviceUsage`` stays what it was, while the agent re-registers
every plugin. Real parts: the control plane, the kubelet's device manager in its own mount
namespace, the agent's device-plugin service.

Also against that device manager: its plugin server hangs up on a freshly registered plugin
when an older client of the same resource ends afterwards (it disconnects by name), and the
agent must notice and register again rather than leave the resource unhealthy for good.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient

from agent.deviceplugins.slots.rules import is_held_by, usage_of
from tests.harness import kubebin
from tests.harness.agent_nodes import (
    AgentNode,
    AgentNodes,
    create_instance,
    node_device,
    read_instance,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import WAIT_S, wait_allocatable, wait_until
from tests.harness.testplugin import TestPlugin
from tests.integration.test_device_plugin_service import run_pod
from tests.integration.test_node_emulator import create_pod, pod_manifest, wait_phase

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
async def agent_node(control_plane: ControlPlane, kube: AsyncClient) -> AsyncIterator[AgentNode]:
    nodes = AgentNodes(kube=kube, kubeconfig=control_plane.kubeconfig, kubelet=DeviceNode)
    yield await nodes.start()
    await nodes.stop_all()


async def held_slots(kube: AsyncClient, namespace: str, name: str, node: str) -> set[str]:
    """Slots the Instance's deviceUsage records as held by ``node``."""
    instance = await read_instance(kube, namespace, name)
    return {slot for slot in instance.spec.device_usage
            if is_held_by(usage_of(instance, slot), node)}


async def test_running_pods_keep_their_slots_across_a_kubelet_restart(
    agent_node: AgentNode, kube: AsyncClient, pod_namespace: str,
) -> None:
    node, ns, configuration = agent_node, pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    assert isinstance(node.emulator, DeviceNode)
    name = await create_instance(kube, ns, configuration=configuration, digest="f6f6f6",
                                 nodes=[node.name], capacity=2)
    await node.table.put(node_device(ns, configuration, name))
    resource = f"edgeplug.io/{name}"
    await wait_allocatable(kube, node.name, resource, "2")
    await create_pod(kube, ns, pod_manifest("holder", resources={resource: "1"}))
    await wait_phase(kube, ns, "holder", "Running")
    [held] = node.emulator.allocated_device_ids(resource)

    async def recorded() -> bool:
        return await held_slots(kube, ns, name, node.name) == {held}

    await wait_until(recorded, what=f"{held} recorded in deviceUsage for {node.name}")
    before = await read_instance(kube, ns, name)
    calls = node.allocations(ns, configuration)
    registered = len(node.emulator.registrations)

    await node.emulator.restart_kubelet()

    await node.emulator.wait_for(
        lambda: resource in {r.resource_name for r in node.emulator.registrations[registered:]},
        timeout=WAIT_S, what=f"{resource} registered again")
    await wait_allocatable(kube, node.name, resource, "2")
    # The running pod still holds its slot, from the checkpoint, without a second Allocate...
    assert node.emulator.allocated_device_ids(resource) == {held}
    assert node.allocations(ns, configuration) == calls
    # ...and the agent's record of it is unchanged.
    assert (await read_instance(kube, ns, name)).spec.device_usage == before.spec.device_usage
    # The other slot is still free, and the next pod gets it.
    await create_pod(kube, ns, pod_manifest("next", resources={resource: "1"}))
    await wait_phase(kube, ns, "next", "Running")
    [second] = node.emulator.allocated_device_ids(resource) - {held}

    async def both_recorded() -> bool:
        return await held_slots(kube, ns, name, node.name) == {held, second}

    await wait_until(both_recorded, what=f"{held} and {second} recorded for {node.name}")
    assert node.allocations(ns, configuration) == calls + 1


async def test_a_plugin_the_kubelet_hangs_up_on_registers_again(
    kube: AsyncClient, pod_namespace: str, agent_node: AgentNode
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    name, node = f"{configuration}-e5e5e5", agent_node
    resource = f"edgeplug.io/{name}"
    # An older client of the resource: what a killed agent's plugin is to the kubelet until
    # it has handled that plugin's end.
    older = TestPlugin(plugin_dir=node.emulator.plugin_dir, resource_name=resource,
                       devices={"old0": "Healthy"})
    await older.start()
    try:
        await wait_allocatable(kube, node.name, resource, "1")
        await create_instance(kube, ns, configuration=configuration, digest="e5e5e5",
                              nodes=[node.name], capacity=2)
        await node.table.put(node_device(ns, configuration, name))
        await wait_allocatable(kube, node.name, resource, "2")
        registered = node.counter("edgeplug_kubelet_registrations_total", kind="re")
    finally:
        # The older client's stream ends now: the kubelet disconnects the agent's client.
        await older.stop()

    async def registered_again() -> bool:
        return node.counter("edgeplug_kubelet_registrations_total", kind="re") > registered

    if kubebin.KUBE_VERSION == kubebin.OLDEST_VERSION:
        # Before v1.37 the kubelet keeps one client per resource: the older client's end
        # disconnects the agent's too, and the agent must register again.
        await wait_until(registered_again, what=f"{resource} registered again after the hang-up")
    # From v1.37 the device manager keeps a client per socket and drops only the one that
    # ended (PluginDisconnected names its socket): the agent's plugin stays registered.
    await wait_allocatable(kube, node.name, resource, "2")
    await run_pod(kube, ns, "after-hang-up", {resource: "1"})
    assert node.allocations(ns, configuration) == 1, (
        "the agent's plugin answered the pod's Allocate")
    assert older.calls.allocate == []
