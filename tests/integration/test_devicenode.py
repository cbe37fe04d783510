"""The harness against the kubelet's own device manager: slots, Allocate, restarts, CDI.

Why this exists: the Python node emulator is our reading of the kubelet; ``DeviceNode`` runs
the kubelet's real device manager (pkg/kubelet/cm/devicemanager), its admission and its
pod-resources server. These tests show it serves device plugins as the kubelet does (a plugin
on another gRPC stack, grpc-go, registers and serves through it), admits and fails pods as the
kubelet does, keeps allocations across a kubelet restart from its checkpoint without repeating
Allocate (and allocates anew after a reboot), and resolves CDI names as a CDI-enabled runtime
does. Real parts: the control plane, gRPC over Unix sockets, mount namespaces.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc.aio
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from agent.kubeletapi import podresources_v1_pb2 as pr
from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import CHECKPOINT, DeviceNode
from tests.harness.devicenode_plugin import GoPlugin
from tests.harness.kube_waits import wait_allocatable
from tests.harness.testplugin import CDI_KIND, TestPlugin, expected_response, write_cdi_spec
from tests.integration.test_node_emulator import create_pod, pod_manifest, wait_phase

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

HEALTHY = "Healthy"
GRPC_TIMEOUT_S = 10.0
#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
WAIT_S = 60.0
#: A plugin that re-registered after a reboot shows its devices within this, or registers again.
REREGISTER_S = 10.0
REGISTER_ATTEMPTS = 3


@pytest.fixture
def node_dirs() -> Iterator[tuple[Path, Path]]:
    # Short paths: a Unix socket path must fit in 108 bytes.
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-dnp-", dir="/tmp"))
    cdi_dir = Path(tempfile.mkdtemp(prefix="ep-cdi-", dir="/tmp"))
    yield plugin_dir, cdi_dir
    shutil.rmtree(plugin_dir, ignore_errors=True)
    shutil.rmtree(cdi_dir, ignore_errors=True)


@pytest.fixture
async def node(control_plane: ControlPlane,
               node_dirs: tuple[Path, Path]) -> AsyncIterator[DeviceNode]:
    plugin_dir, cdi_dir = node_dirs
    device_node = DeviceNode(node_name=f"dn-{uuid.uuid4().hex[:8]}",
                             kubeconfig=control_plane.kubeconfig, plugin_dir=plugin_dir,
                             pod_resources_socket=plugin_dir.parent / f"{plugin_dir.name}.pr",
                             cdi_spec_dirs=[cdi_dir])
    await device_node.start()
    yield device_node
    await device_node.stop(delete_node=True)


@pytest.fixture
async def plugin(node: DeviceNode, node_dirs: tuple[Path, Path]) -> AsyncIterator[TestPlugin]:
    # The test plugin hands out CDI names; a runtime creates the containers only with specs.
    write_cdi_spec(node_dirs[1], ["d0", "d1", "d2"])
    test_plugin = TestPlugin(plugin_dir=node.plugin_dir,
                             resource_name=f"test.edgeplug.io/dev-{uuid.uuid4().hex[:8]}",
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


async def test_a_grpc_go_plugin_registers_and_serves_through_the_device_manager(
    node: DeviceNode, kube: AsyncClient, pod_namespace: str,
) -> None:
    resource = f"test.edgeplug.io/go-{uuid.uuid4().hex[:8]}"
    # The plugin refuses any call whose :authority is not a plain host (as tonic/h2 does).
    plugin = GoPlugin(plugin_dir=node.plugin_dir, resource=resource, devices=["g0", "g1"])
    await plugin.start()
    try:
        assert plugin.authorities == ["localhost"]  # the kubelet's grpc.WithAuthority
        await wait_allocatable(kube, node.node_name, resource, "2")
        assert [r.resource_name for r in node.registrations] == [resource]
        await create_pod(kube, pod_namespace, pod_manifest("go", resources={resource: "2"}))
        await wait_phase(kube, pod_namespace, "go", "Running")
        [allocation] = node.allocations(pod_namespace, "go")
        assert allocation.device_ids == ("g0", "g1")
        assert set(allocation.envs["GO_PLUGIN_DEVICES"].split(",")) == {"g0", "g1"}
    finally:
        await plugin.stop()


async def test_a_plugin_gone_leaves_capacity_with_nothing_allocatable(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await plugin.stop()
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "0")
    # Within the kubelet's 5-minute grace the devices count as unhealthy: still capacity.
    found = await kube.get(Node, node.node_name)
    assert found.status is not None
    assert (found.status.capacity or {})[plugin.resource_name] == "3"
    assert not node.plugin_connected(plugin.resource_name)


async def test_pods_get_devices_and_a_failed_allocate_is_an_admission_error(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("user", resources={plugin.resource_name: "2"}))
    await wait_phase(kube, pod_namespace, "user", "Running")
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
    await create_pod(kube, pod_namespace,
                     pod_manifest("refused", resources={plugin.resource_name: "1"}))
    failed = await wait_phase(kube, pod_namespace, "refused", "Failed")
    assert failed.status is not None
    assert failed.status.reason == "UnexpectedAdmissionError"
    assert "test plugin told to fail Allocate" in (failed.status.message or "")
    assert node.allocated_device_ids(plugin.resource_name) == held


async def test_kubelet_restart_keeps_allocations_from_the_checkpoint_without_allocate(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("holder", resources={plugin.resource_name: "2"}))
    await wait_phase(kube, pod_namespace, "holder", "Running")
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
    await create_pod(kube, pod_namespace,
                     pod_manifest("next", resources={plugin.resource_name: "1"}))
    await wait_phase(kube, pod_namespace, "next", "Running")
    [allocation] = node.allocations(pod_namespace, "next")
    assert set(allocation.device_ids) == {"d0", "d1", "d2"} - held


async def test_a_reboot_forgets_the_allocations_of_running_pods(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("survivor", resources={plugin.resource_name: "2"}))
    await wait_phase(kube, pod_namespace, "survivor", "Running")

    await node.reboot()  # neither checkpoint nor running containers survive

    # The survivor is admitted again at once, before its plugin is back: the kubelet does not
    # know the resource yet and starts it without devices (its known start-up race).
    await node.wait_for(lambda: node.pod_admitted(pod_namespace, "survivor"), timeout=WAIT_S,
                        what="the survivor admitted again")
    assert node.allocations(pod_namespace, "survivor") == []
    # The Node may still show the allocatable count from before the reboot: wait for the
    # kubelet itself to know the plugin's devices again, or "next" could be admitted without
    # them. Now and then the kubelet takes the registration but then drops it: the stopped
    # plugin's old stream ends after the new registration, and the kubelet's plugin server
    # disconnects the client of that resource name, which is by then the new one (runClient in
    # kubelet/cm/devicemanager/plugin/v1beta1). A plugin must register once more then, as the
    # agent does by itself (agent/deviceplugin/manager.py); this test plugin does it here.
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        await plugin.stop()
        await plugin.start()
        try:
            await node.wait_for(lambda: len(node.healthy_device_ids(plugin.resource_name)) == 3,
                                timeout=REREGISTER_S, what="the plugin's three devices known")
            break
        except TimeoutError:
            if attempt == REGISTER_ATTEMPTS:
                raise
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    # Its old devices are held no more: pod-resources lists it without any, and the new
    # checkpoint holds only the next pod's.
    await create_pod(kube, pod_namespace,
                     pod_manifest("next", resources={plugin.resource_name: "1"}))
    await wait_phase(kube, pod_namespace, "next", "Running")
    [allocation] = node.allocations(pod_namespace, "next")
    assert await listed(node.pod_resources_socket or Path()) == [
        ("next", list(allocation.device_ids)), ("survivor", [])]
    checkpoint = json.loads((node.plugin_dir / CHECKPOINT).read_text())
    assert [e["DeviceIDs"] for e in checkpoint["Data"]["PodDeviceEntries"]] == [
        {"-1": list(allocation.device_ids)}]
    assert len(plugin.calls.allocate) == 2


async def test_cdi_names_are_resolved_as_a_runtime_does_or_the_pod_fails(
    node: DeviceNode, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
    node_dirs: tuple[Path, Path],
) -> None:
    await wait_allocatable(kube, node.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("cdi", resources={plugin.resource_name: "1"}))
    await wait_phase(kube, pod_namespace, "cdi", "Running")
    [container] = node.containers(pod_namespace, "cdi")
    [device] = container["deviceIDs"][plugin.resource_name]
    assert container["cdiDevices"] == [f"{CDI_KIND}={device}"]
    [allocation] = node.allocations(pod_namespace, "cdi")
    assert allocation.cdi_edits is not None
    assert allocation.cdi_edits.env["CDI_DEVICE"] == device
    assert [n.path for n in allocation.cdi_edits.device_nodes] == ["/dev/null"]

    for spec in node_dirs[1].iterdir():
        spec.unlink()
    await create_pod(kube, pod_namespace,
                     pod_manifest("unresolved", resources={plugin.resource_name: "1"}))
    failed = await wait_phase(kube, pod_namespace, "unresolved", "Failed")
    assert failed.status is not None
    assert failed.status.reason == "CreateContainerError"
    assert "unresolvable CDI devices" in (failed.status.message or "")


async def test_pre_start_comes_after_admission_and_its_failure_fails_the_container(
    node: DeviceNode, kube: AsyncClient, pod_namespace: str,
) -> None:
    plugin = TestPlugin(plugin_dir=node.plugin_dir,
                        resource_name=f"test.edgeplug.io/ps-{uuid.uuid4().hex[:8]}",
                        devices={"p0": HEALTHY, "p1": HEALTHY}, pre_start_required=True,
                        fail_pre_start=True)
    await plugin.start()
    try:
        await wait_allocatable(kube, node.node_name, plugin.resource_name, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("prestart", resources={plugin.resource_name: "1"}))
        failed = await wait_phase(kube, pod_namespace, "prestart", "Failed")
        # Admitted (Allocate answered), then the kubelet's PreStartContainer call at container
        # start failed: the container's config could not be made, not an admission error.
        assert failed.status is not None
        assert failed.status.reason == "CreateContainerConfigError"
        assert "test plugin told to fail PreStart" in (failed.status.message or "")
        assert len(plugin.calls.allocate) == 1
        assert plugin.calls.pre_start == plugin.calls.allocate
    finally:
        await plugin.stop()
