"""The harness against the kubelet's own device manager: slots, Allocate, restarts.

The Python node emulator is our reading of the kubelet; ``DeviceNode`` runs
the kubelet's real device manager (pkg/kubelet/cm/devicemanager), its admission and its
pod-resources server. These tests show what only it has: it admits and fails pods as the
kubelet does, keeps allocations across a kubelet restart from its checkpoint without repeating
Allocate, and allocates anew after a reboot. What both stand-ins must do alike (a grpc-go
plugin, CDI names, a plugin gone, PreStartContainer) is in test_devicenode_parity.py, which runs
on both. Real parts: the control plane, gRPC over Unix sockets, mount namespaces.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc.aio
import pytest
from lightkube import AsyncClient

from agent.kubeletapi import podresources_v1_pb2 as pr
from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import CHECKPOINT, DeviceNode
from tests.harness.kube_waits import wait_allocatable
from tests.harness.stand_ins import HEALTHY, NodeDirs, new_resource, node_dirs, running_node
from tests.harness.testplugin import TestPlugin, expected_response, write_cdi_spec
from tests.integration.test_node_emulator import (
    fail_pod,
    run_pod,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

GRPC_TIMEOUT_S = 10.0
#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
WAIT_S = 60.0


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with node_dirs() as made:
        yield made


@pytest.fixture
async def node(control_plane: ControlPlane, dirs: NodeDirs) -> AsyncIterator[DeviceNode]:
    async with running_node(DeviceNode, control_plane.kubeconfig, dirs) as device_node:
        yield device_node


@pytest.fixture
async def plugin(node: DeviceNode, dirs: NodeDirs) -> AsyncIterator[TestPlugin]:
    # The test plugin hands out CDI names; a runtime creates the containers only with specs.
    write_cdi_spec(dirs.cdi_dir, ["d0", "d1", "d2"])
    test_plugin = TestPlugin(plugin_dir=node.plugin_dir, resource_name=new_resource(),
                             devices={"d0": HEALTHY, "d1": HEALTHY, "d2": HEALTHY})
    await test_plugin.start()
    yield test_plugin
    await test_plugin.stop()


async def listed(socket: Path) -> list[tuple[str, list[str]]]:
    """(pod, device ids of its first container) for each pod pod-resources lists."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        answer = await pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=GRPC_TIMEOUT_S)
    return sorted((p.name, sorted(i for d in p.containers[0].devices for i in d.device_ids))
                  for p in answer.pod_resources)


async def test_pods_get_devices_and_a_failed_allocate_is_an_admission_error(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "user", {plugin.resource_name: "2"})
    [allocation] = node.allocations(pod_namespace, "user")
    held = set(allocation.device_ids)
    assert len(held) == 2
    assert [set(ids) for ids in plugin.calls.allocate] == [held]
    want = expected_response(sorted(held))
    assert allocation.envs["TEST_DEVICES"] in {",".join(sorted(held)),
                                               ",".join(sorted(held, reverse=True))}
    assert {m[0] for m in allocation.mounts} == {m.container_path for m in want.mounts}
    assert node.allocated_device_ids(plugin.resource_name) == held
    assert await listed(node.pod_resources_socket or Path()) == [("user", sorted(held))]

    plugin.fail_allocate = True
    await fail_pod(kube, pod_namespace, "refused", {plugin.resource_name: "1"},
                   reason="UnexpectedAdmissionError", says="test plugin told to fail Allocate")
    assert node.allocated_device_ids(plugin.resource_name) == held


async def test_kubelet_restart_keeps_allocations_from_the_checkpoint_without_allocate(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "holder", {plugin.resource_name: "2"})
    held = node.allocated_device_ids(plugin.resource_name)
    checkpoint = json.loads((node.plugin_dir / CHECKPOINT).read_text())
    assert {e["ResourceName"] for e in checkpoint["Data"]["PodDeviceEntries"]} == {
        plugin.resource_name}

    await node.restart_kubelet()

    assert not plugin.socket_path.exists(), "the restarted device manager deletes plugin sockets"
    assert not node.plugin_connected(plugin.resource_name)
    await plugin.stop()
    await plugin.start()
    assert node.plugin_connected(plugin.resource_name)
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    # The running pod kept its devices: no second Allocate, and pod-resources still says so.
    assert len(plugin.calls.allocate) == 1
    assert node.allocated_device_ids(plugin.resource_name) == held
    assert await listed(node.pod_resources_socket or Path()) == [("holder", sorted(held))]
    # A new pod gets the one device left, not one of the holder's.
    await run_pod(kube, pod_namespace, "next", {plugin.resource_name: "1"})
    [allocation] = node.allocations(pod_namespace, "next")
    assert set(allocation.device_ids) == {"d0", "d1", "d2"} - held


async def test_a_reboot_forgets_the_allocations_of_running_pods(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "survivor", {plugin.resource_name: "2"})

    await node.reboot()  # neither checkpoint nor running containers survive

    # The survivor is admitted again at once, before its plugin is back: the kubelet does not
    # know the resource yet and starts it without devices (its known start-up race).
    await node.wait_for(lambda: node.pod_admitted(pod_namespace, "survivor"), timeout=WAIT_S,
                        what="the survivor admitted again")
    assert node.allocations(pod_namespace, "survivor") == []
    # The Node may still show the allocatable count from before the reboot: wait for the
    # kubelet itself to know the plugin's devices again, or "next" could be admitted without
    # them. The fresh kubelet removed the plugin's socket when it started, as a real one does,
    # so the plugin serves a new one and registers once.
    await plugin.stop()
    await plugin.start()
    await node.wait_for(lambda: len(node.healthy_device_ids(plugin.resource_name)) == 3,
                        timeout=WAIT_S, what="the plugin's three devices known")
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    # Its old devices are held no more: pod-resources lists it without any, and the new
    # checkpoint holds only the next pod's.
    await run_pod(kube, pod_namespace, "next", {plugin.resource_name: "1"})
    [allocation] = node.allocations(pod_namespace, "next")
    assert await listed(node.pod_resources_socket or Path()) == [
        ("next", list(allocation.device_ids)), ("survivor", [])]
    checkpoint = json.loads((node.plugin_dir / CHECKPOINT).read_text())
    assert [e["DeviceIDs"] for e in checkpoint["Data"]["PodDeviceEntries"]] == [
        {"-1": list(allocation.device_ids)}]
    assert len(plugin.calls.allocate) == 2
