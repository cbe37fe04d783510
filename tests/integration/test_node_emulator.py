"""The node emulator behaves as a kubelet towards device plugins, the scheduler and the API.

Every agent test trusts the emulator to stand in for the real kubelet, so the
emulator is itself tested against real parts: the real control plane (API server, scheduler,
controller-manager), a real gRPC device plugin over Unix sockets (tests/harness/testplugin.py),
and the real pod-resources API. Waits poll the API or the emulator with a deadline.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from agent.kubeletapi import podresources_v1_pb2 as pr
from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import (
    allocatable,
    in_phase,
    wait_allocatable,
    wait_pod,
    wait_until,
)
from tests.harness.kubelet_records import is_extended_resource_name
from tests.harness.node_emulator import ADMISSION_ERROR, NodeEmulator, PythonNodeEmulator
from tests.harness.testplugin import CDI_KIND, TestPlugin, env_name, expected_response

pytestmark = pytest.mark.timeout(180)

#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
SCHEDULE_WAIT_S = 60.0
GRPC_TIMEOUT_S = 10.0
HEALTHY = "Healthy"


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short paths: a Unix socket path must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="ep-kl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def new_node_name() -> str:
    return f"emu-{uuid.uuid4().hex[:8]}"


def new_resource() -> str:
    return f"test.edgeplug.io/dev-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def emulator(control_plane: ControlPlane, plugin_dir: Path) -> AsyncIterator[NodeEmulator]:
    node = PythonNodeEmulator(node_name=new_node_name(), kubeconfig=control_plane.kubeconfig,
                        plugin_dir=plugin_dir, pod_resources_socket=plugin_dir / "pr.sock",
                        labels={"edgeplug.test/role": "emulated"})
    await node.start()
    yield node
    await node.stop(delete_node=True)


@pytest.fixture
async def plugin(emulator: NodeEmulator) -> AsyncIterator[TestPlugin]:
    test_plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                             devices={"d0": HEALTHY, "d1": HEALTHY, "d2": HEALTHY},
                             preferred=["d2", "d0", "d1"])
    await test_plugin.start()
    yield test_plugin
    await test_plugin.stop()


# -- helpers -------------------------------------------------------------------------------


def pod_manifest(name: str, *, resources: Mapping[str, str] | None = None,
                 node_selector: Mapping[str, str] | None = None,
                 init_resources: Mapping[str, str] | None = None) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/pause:1"}
    if resources:
        container["resources"] = {"limits": dict(resources)}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 30}
    if init_resources:
        spec["initContainers"] = [{"name": "init", "image": "registry.invalid/pause:1",
                                   "resources": {"limits": dict(init_resources)}}]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return cast(Pod, Pod.from_dict({"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": name}, "spec": spec}))


async def create_pod(kube: AsyncClient, namespace: str, pod: Pod) -> None:
    assert pod.metadata is not None
    pod.metadata.namespace = namespace
    await kube.create(pod)


async def wait_phase(kube: AsyncClient, namespace: str, name: str, phase: str,
                     *, within: float = SCHEDULE_WAIT_S) -> Pod:
    return await wait_pod(kube, namespace, name, lambda pod: in_phase(pod, phase), phase,
                          within=within)


async def run_pod(kube: AsyncClient, namespace: str, name: str,
                  resources: Mapping[str, str]) -> Pod:
    """Create a pod with these device limits and return it once it runs."""
    await create_pod(kube, namespace, pod_manifest(name, resources=resources))
    return await wait_phase(kube, namespace, name, "Running")


async def fail_pod(kube: AsyncClient, namespace: str, name: str, resources: Mapping[str, str],
                   *, reason: str, says: str) -> Pod:
    """Create a pod with these device limits; return it once Failed with ``reason`` and a
    message that contains ``says``."""
    await create_pod(kube, namespace, pod_manifest(name, resources=resources))
    pod = await wait_phase(kube, namespace, name, "Failed")
    assert pod.status is not None
    assert pod.status.reason == reason, pod.status
    assert says in (pod.status.message or ""), pod.status
    return pod


# -- registration and capacity -------------------------------------------------------------


async def test_plugin_registers_and_its_devices_become_allocatable(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    node = await kube.get(Node, emulator.node_name)
    assert node.status is not None
    assert node.status.capacity is not None
    assert node.status.capacity[plugin.resource_name] == "3"
    assert [r.resource_name for r in emulator.registrations] == [plugin.resource_name]
    assert emulator.registrations[0].endpoint == plugin.socket_name
    assert emulator.registrations[0].get_preferred_allocation_available
    assert plugin.calls.options == 1
    assert plugin.calls.list_and_watch == 1


# -- pods ----------------------------------------------------------------------------------


async def test_scheduled_pod_gets_the_plugins_allocation_and_runs(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    pod = await run_pod(kube, pod_namespace, "user", {plugin.resource_name: "2"})

    assert pod.spec is not None
    assert pod.spec.nodeName == emulator.node_name  # bound by the real scheduler
    assert pod.status is not None
    assert pod.status.containerStatuses is not None
    assert [c.ready for c in pod.status.containerStatuses] == [True]
    assert {c.type: c.status for c in pod.status.conditions or []}["Ready"] == "True"
    [allocation] = emulator.allocations(pod_namespace, "user")
    # The plugin prefers d2 then d0: the emulator asked it and used its answer.
    assert plugin.calls.preferred == [(("d0", "d1", "d2"), 2)]
    assert allocation.device_ids == ("d2", "d0")
    assert plugin.calls.allocate == [("d2", "d0")]
    want = expected_response(["d2", "d0"])
    assert allocation.resource_name == plugin.resource_name
    assert allocation.container == "main"
    assert allocation.envs == dict(want.envs)
    assert allocation.envs[env_name("d2")] == "d2"
    assert allocation.mounts == (("/var/test/d2", "/srv/test/d2", True),
                                 ("/var/test/d0", "/srv/test/d0", True))
    assert allocation.devices == (("/dev/test-d2", "/dev/null", "rw"),
                                  ("/dev/test-d0", "/dev/null", "rw"))
    assert allocation.cdi_devices == (f"{CDI_KIND}=d2", f"{CDI_KIND}=d0")
    assert allocation.annotations == {"test.edgeplug.io/devices": "d2,d0"}
    assert emulator.allocated_device_ids(plugin.resource_name) == {"d0", "d2"}


async def test_pod_asking_for_more_devices_than_exist_stays_pending(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("greedy", resources={plugin.resource_name: "4"}))

    async def unschedulable() -> bool:
        pod = await kube.get(Pod, "greedy", namespace=pod_namespace)
        assert pod.status is not None
        assert pod.status.phase == "Pending", f"pod left Pending: {pod.status}"
        return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in pod.status.conditions or [])

    await wait_until(unschedulable, what="the scheduler to call the pod Unschedulable")
    pod = await kube.get(Pod, "greedy", namespace=pod_namespace)
    assert pod.spec is not None
    assert pod.spec.nodeName is None
    assert pod.status is not None
    assert pod.status.phase == "Pending"
    assert plugin.calls.allocate == []
    assert emulator.allocations(pod_namespace, "greedy") == []


async def test_pod_without_extended_resources_just_runs(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    await create_pod(kube, pod_namespace, pod_manifest(
        "plain", node_selector={"kubernetes.io/hostname": emulator.node_name}))

    pod = await wait_phase(kube, pod_namespace, "plain", "Running")

    assert pod.spec is not None
    assert pod.spec.nodeName == emulator.node_name
    assert emulator.allocations(pod_namespace, "plain") == []
    assert emulator.pod_admitted(pod_namespace, "plain")


async def test_deleting_a_pod_frees_its_devices_for_the_next_pod(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "first", {plugin.resource_name: "3"})
    assert emulator.allocated_device_ids(plugin.resource_name) == {"d0", "d1", "d2"}

    # A graceful delete: the emulated kubelet confirms it, as a real one does.
    await kube.delete(Pod, "first", namespace=pod_namespace)

    async def gone() -> bool:
        try:
            await kube.get(Pod, "first", namespace=pod_namespace)
        except ApiError as error:
            return error.status.code == 404
        return False

    await wait_until(gone, what="the deleted pod to disappear")
    assert emulator.allocated_device_ids(plugin.resource_name) == set()
    await run_pod(kube, pod_namespace, "second", {plugin.resource_name: "3"})
    assert emulator.allocated_device_ids(plugin.resource_name) == {"d0", "d1", "d2"}


async def test_failed_allocate_fails_the_pod_with_unexpected_admission_error(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    broken = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"x": HEALTHY}, fail_allocate=True)
    await broken.start()
    try:
        await wait_allocatable(kube, emulator.node_name, broken.resource_name, "1")
        await fail_pod(kube, pod_namespace, "doomed", {broken.resource_name: "1"},
                       reason=ADMISSION_ERROR, says="test plugin told to fail Allocate")
        assert broken.calls.allocate == [("x",)]
        assert emulator.allocated_device_ids(broken.resource_name) == set()
    finally:
        await broken.stop()


async def test_pre_start_and_init_containers_follow_the_kubelet(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    prestart = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                          devices={"a": HEALTHY, "b": HEALTHY}, pre_start_required=True)
    await prestart.start()
    try:
        await wait_allocatable(kube, emulator.node_name, prestart.resource_name, "2")
        await create_pod(kube, pod_namespace, pod_manifest(
            "staged", resources={prestart.resource_name: "2"},
            init_resources={prestart.resource_name: "1"}))

        await wait_phase(kube, pod_namespace, "staged", "Running")

        init, main = emulator.allocations(pod_namespace, "staged")
        assert (init.container, init.init_container, init.device_ids) == ("init", True, ("a",))
        # The init container's device is free again once it finished: the app may reuse it.
        assert (main.container, main.init_container, main.device_ids) == ("main", False,
                                                                          ("a", "b"))
        assert prestart.calls.pre_start == [("a",), ("a", "b")]
        assert prestart.calls.preferred == []  # the plugin does not offer it
    finally:
        await prestart.stop()


# -- plugin lifecycle ------------------------------------------------------------------------


async def test_only_healthy_devices_are_allocatable(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    plugin.set_devices({"d0": HEALTHY, "d1": "Unhealthy", "d2": "Unhealthy"})
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "1")
    node = await kube.get(Node, emulator.node_name)
    assert node.status is not None
    assert node.status.capacity is not None
    # As the kubelet's GetCapacity: unhealthy devices count in capacity, not in allocatable.
    assert node.status.capacity[plugin.resource_name] == "3"

    await run_pod(kube, pod_namespace, "healthy", {plugin.resource_name: "1"})

    [allocation] = emulator.allocations(pod_namespace, "healthy")
    assert allocation.device_ids == ("d0",)
    assert plugin.calls.preferred == [(("d0",), 1)]


async def test_plugin_going_away_zeroes_its_resource(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await plugin.stop()
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "0")
    assert emulator.healthy_device_ids(plugin.resource_name) == []


async def test_re_registration_replaces_the_old_stream(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    successor = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=plugin.resource_name,
                           socket_name="successor.sock", devices={"n0": HEALTHY, "n1": HEALTHY})
    await successor.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        # The old plugin going away now must not zero what the new one advertises.
        await plugin.stop()
        successor.set_devices({"n0": HEALTHY, "n1": HEALTHY, "n2": HEALTHY, "n3": HEALTHY})
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "4")
        assert [r.endpoint for r in emulator.registrations] == [plugin.socket_name,
                                                                "successor.sock"]
        assert emulator.healthy_device_ids(plugin.resource_name) == ["n0", "n1", "n2", "n3"]
    finally:
        await successor.stop()


@pytest.mark.parametrize(("version", "resource", "endpoint", "complaint"), [
    ("v1alpha", "test.edgeplug.io/x", "x.sock", "unsupported version"),
    ("v1beta1", "cpu", "x.sock", "invalid extended resource name"),
    ("v1beta1", "kubernetes.io/x", "x.sock", "invalid extended resource name"),
    ("v1beta1", "test.edgeplug.io/x", "../x.sock", "invalid endpoint"),
    ("v1beta1", "test.edgeplug.io/x", "", "invalid endpoint"),
])
async def test_invalid_registrations_are_refused(
    emulator: NodeEmulator, version: str, resource: str, endpoint: str, complaint: str,
) -> None:
    bad = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=resource,
                     socket_name=endpoint or "unused.sock", devices={})
    bad.socket_name = endpoint
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await bad.register(version=version)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert complaint in (refused.value.details() or "")
    assert emulator.registrations == []


async def test_a_garbage_plugin_does_not_hurt_the_emulator(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    # Registers, but nothing serves its socket; then one whose socket is not even gRPC.
    # The kubelet dials a plugin back inside Register, so both registrations are refused.
    ghost = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                       devices={})
    with pytest.raises(grpc.aio.AioRpcError):
        await ghost.register()
    junk_path = emulator.plugin_dir / "junk.sock"
    junk = await asyncio.start_unix_server(junk_reply, path=str(junk_path))
    try:
        garbage = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                             socket_name="junk.sock", devices={})
        with pytest.raises(grpc.aio.AioRpcError):
            await garbage.register()
        good = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                          devices={"g": HEALTHY})
        await good.start()
        try:
            await wait_allocatable(kube, emulator.node_name, good.resource_name, "1")
            await create_pod(kube, pod_namespace,
                             pod_manifest("fine", resources={good.resource_name: "1"}))
            await wait_phase(kube, pod_namespace, "fine", "Running")
            for broken in (ghost, garbage):
                assert await allocatable(kube, emulator.node_name, broken.resource_name) is None
            assert [r.resource_name for r in emulator.registrations] == [good.resource_name]
        finally:
            await good.stop()
    finally:
        junk.close()
        await junk.wait_closed()


async def junk_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.0 418 I am not a device plugin\r\n\r\n")
    await writer.drain()
    writer.close()


async def test_kubelet_restart_deletes_plugin_sockets_and_serves_a_fresh_kubelet_sock(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "survivor", {plugin.resource_name: "1"})
    assert plugin.socket_path.is_socket()

    await emulator.restart_kubelet()

    assert not plugin.socket_path.exists(), "a kubelet restart deletes every plugin socket"
    assert emulator.kubelet_socket.is_socket()
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "0")
    # Allocations are checkpointed across a kubelet restart, and pod-resources still says so.
    assert emulator.allocated_device_ids(plugin.resource_name) == {"d2"}
    assert emulator.pod_resources_socket is not None
    async with grpc.aio.insecure_channel(f"unix:{emulator.pod_resources_socket}") as channel:
        listed = await pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=GRPC_TIMEOUT_S)
    assert [(p.name, [list(d.device_ids) for d in p.containers[0].devices])
            for p in listed.pod_resources] == [("survivor", [["d2"]])]
    # The fresh kubelet.sock takes the plugin's re-registration.
    await plugin.stop()
    await plugin.start()
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    assert len(emulator.registrations) == 2
    await run_pod(kube, pod_namespace, "after", {plugin.resource_name: "2"})
    [allocation] = emulator.allocations(pod_namespace, "after")
    assert set(allocation.device_ids) == {"d0", "d1"}  # d2 is still the survivor's


# -- the Node, several nodes, pod-resources --------------------------------------------------


async def test_node_is_ready_labelled_and_heartbeats_through_its_lease(
    emulator: NodeEmulator, kube: AsyncClient,
) -> None:
    node = await kube.get(Node, emulator.node_name)
    assert node.metadata is not None
    assert node.metadata.labels is not None
    assert node.metadata.labels["kubernetes.io/hostname"] == emulator.node_name
    assert node.metadata.labels["edgeplug.test/role"] == "emulated"
    assert node.status is not None
    assert {c.type: c.status for c in node.status.conditions or []}["Ready"] == "True"
    addresses = [(a.type, a.address) for a in node.status.addresses or []]
    assert ("InternalIP", "127.0.0.1") in addresses
    assert node.status.allocatable is not None
    assert node.status.allocatable["pods"] != "0"
    assert not (node.spec and node.spec.taints), "a Ready node carries no not-ready taint"

    first = await kube.get(Lease, emulator.node_name, namespace="kube-node-lease")
    assert first.spec is not None
    assert first.spec.holderIdentity == emulator.node_name
    first_renewal = first.spec.renewTime

    async def renewed() -> bool:
        lease = await kube.get(Lease, emulator.node_name, namespace="kube-node-lease")
        assert lease.spec is not None
        return lease.spec.renewTime != first_renewal

    await wait_until(renewed, what="the node's Lease to be renewed")


async def test_an_idle_node_renews_its_lease_without_rewriting_its_status(
    emulator: NodeEmulator, kube: AsyncClient,
) -> None:
    # As the kubelet since its Lease took the heartbeat over (nodeStatusReportFrequency):
    # whatever watches the Node, an agent among them, sees an idle node stay quiet.
    def ready_heartbeat(node: Node) -> str | None:
        assert node.status is not None
        [ready] = [c for c in node.status.conditions or [] if c.type == "Ready"]
        return str(ready.lastHeartbeatTime)

    before = ready_heartbeat(await kube.get(Node, emulator.node_name))
    renewals: list[object] = []

    async def renewed_twice() -> bool:
        lease = await kube.get(Lease, emulator.node_name, namespace="kube-node-lease")
        assert lease.spec is not None
        if not renewals or renewals[-1] != lease.spec.renewTime:
            renewals.append(lease.spec.renewTime)
        return len(renewals) >= 3  # the first read, then two renewals after it

    await wait_until(renewed_twice, what="two renewals of the node's Lease")
    assert ready_heartbeat(await kube.get(Node, emulator.node_name)) == before


async def test_stop_can_delete_the_node_and_a_new_emulator_adopts_a_kept_one(
    control_plane: ControlPlane, plugin_dir: Path, kube: AsyncClient,
) -> None:
    name = new_node_name()
    first = PythonNodeEmulator(node_name=name, kubeconfig=control_plane.kubeconfig,
                         plugin_dir=plugin_dir, labels={"generation": "one"})
    await first.start()
    await first.stop()  # keeps the Node, as a stopped kubelet does
    second = PythonNodeEmulator(node_name=name, kubeconfig=control_plane.kubeconfig,
                          plugin_dir=plugin_dir, labels={"generation": "two"})
    await second.start()
    try:
        node = await kube.get(Node, name)
        assert node.metadata is not None
        assert node.metadata.labels is not None
        assert node.metadata.labels["generation"] == "two"
    finally:
        await second.stop(delete_node=True)
    with pytest.raises(ApiError) as missing:
        await kube.get(Node, name)
    assert missing.value.status.code == 404
    with pytest.raises(ApiError) as no_lease:
        await kube.get(Lease, name, namespace="kube-node-lease")
    assert no_lease.value.status.code == 404


async def test_two_emulated_nodes_in_one_process_both_get_pods(
    control_plane: ControlPlane, kube: AsyncClient, pod_namespace: str,
) -> None:
    resource = new_resource()  # the same resource on both nodes, as with a shared device
    emulators: list[NodeEmulator] = []
    plugins: list[TestPlugin] = []
    try:
        for index in range(2):
            directory = Path(tempfile.mkdtemp(prefix="ep-kl-", dir="/tmp"))
            started = PythonNodeEmulator(node_name=new_node_name(),
                                         kubeconfig=control_plane.kubeconfig, plugin_dir=directory)
            await started.start()
            emulators.append(started)
            test_plugin = TestPlugin(plugin_dir=directory, resource_name=resource,
                                     devices={f"n{index}-a": HEALTHY})
            await test_plugin.start()
            plugins.append(test_plugin)
        for emulator in emulators:
            await wait_allocatable(kube, emulator.node_name, resource, "1")
        for emulator in emulators:
            await create_pod(kube, pod_namespace, pod_manifest(
                f"on-{emulator.node_name}", resources={resource: "1"},
                node_selector={"kubernetes.io/hostname": emulator.node_name}))

        for index, emulator in enumerate(emulators):
            pod = await wait_phase(kube, pod_namespace, f"on-{emulator.node_name}", "Running")
            assert pod.spec is not None
            assert pod.spec.nodeName == emulator.node_name
            [allocation] = emulator.allocations(pod_namespace, f"on-{emulator.node_name}")
            assert allocation.device_ids == (f"n{index}-a",)
            assert plugins[index].calls.allocate == [(f"n{index}-a",)]
    finally:
        for test_plugin in plugins:
            await test_plugin.stop()
        for emulator in emulators:
            await emulator.stop(delete_node=True)
            shutil.rmtree(emulator.plugin_dir, ignore_errors=True)


async def test_pod_resources_api_lists_live_pods_and_their_devices(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await run_pod(kube, pod_namespace, "listed", {plugin.resource_name: "1"})
    assert emulator.pod_resources_socket is not None

    async with grpc.aio.insecure_channel(f"unix:{emulator.pod_resources_socket}") as channel:
        lister = pr_grpc.PodResourcesListerStub(channel)
        listed = await lister.List(pr.ListPodResourcesRequest(), timeout=GRPC_TIMEOUT_S)
        allocatable_now = await lister.GetAllocatableResources(
            pr.AllocatableResourcesRequest(), timeout=GRPC_TIMEOUT_S)
        one = await lister.Get(
            pr.GetPodResourcesRequest(pod_name="listed", pod_namespace=pod_namespace),
            timeout=GRPC_TIMEOUT_S)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await lister.Get(
                pr.GetPodResourcesRequest(pod_name="nope", pod_namespace=pod_namespace),
                timeout=GRPC_TIMEOUT_S)

    [pod] = [p for p in listed.pod_resources if p.namespace == pod_namespace]
    assert pod.name == "listed"
    [container] = pod.containers
    assert container.name == "main"
    assert [(d.resource_name, list(d.device_ids)) for d in container.devices] == [
        (plugin.resource_name, ["d2"])]
    assert one.pod_resources == pod
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert [(d.resource_name, sorted(d.device_ids)) for d in allocatable_now.devices] == [
        (plugin.resource_name, ["d0", "d1", "d2"])]


@pytest.mark.parametrize(("name", "extended"), [
    ("edgeplug.io/cam-1a2b3c", True),
    ("huawei.com/Ascend910", True),
    ("cpu", False),
    ("memory", False),
    ("hugepages-2Mi", False),
    ("kubernetes.io/batman", False),
    ("node.kubernetes.io/thing", False),
    ("requests.edgeplug.io/x", False),
    ("edgeplug.io/", False),
])
def test_extended_resource_names_are_told_apart_as_the_kubelet_does(
    name: str, extended: bool,
) -> None:
    assert is_extended_resource_name(name) is extended


async def test_a_not_ready_node_is_tainted_by_the_controller_and_recovers(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await emulator.set_node_ready(False)

    async def tainted() -> bool:
        node = await kube.get(Node, emulator.node_name)
        taints = node.spec.taints if node.spec is not None else None
        return any(t.key == "node.kubernetes.io/not-ready" for t in taints or [])

    await wait_until(tainted, what="the node-lifecycle controller's not-ready taint")
    node = await kube.get(Node, emulator.node_name)
    assert node.status is not None
    assert {c.type: c.status for c in node.status.conditions or []}["Ready"] == "False"

    await emulator.set_node_ready(True)
    await run_pod(kube, pod_namespace, "back", {plugin.resource_name: "1"})

    async def untainted() -> bool:
        return not await tainted()

    await wait_until(untainted, what="the not-ready taint to be gone")
