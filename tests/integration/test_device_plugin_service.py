"""The agent's device plugins against the real control plane and the emulated kubelet.

Instances are created directly in the API server, NodeDevices are put in a table, and
``serve_device_plugins`` runs as ``agent.main`` runs it; the node emulator (real gRPC over Unix
sockets, real scheduler placing the pods) plays the kubelet. Every wait polls the API or the
emulator with a deadline and fails saying what it expected.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc import aio
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount
from lightkube.types import PatchType

from agent.deviceplugin.service import serve_device_plugins, socket_name
from agent.kube import InstanceResource, as_dict
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.metrics import AgentMetrics
from agent.node_devices import NodeDevice, NodeDeviceTable
from crds.instance import Instance
from discovery_handlers.contract import DeviceSpec, Mount
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import ADMISSION_ERROR, NodeEmulator

pytestmark = pytest.mark.timeout(180)

#: Generous deadlines for a shared 2-core machine; none of them is a pass/fail timing.
WAIT_S = 60.0
POLL_S = 0.1
#: Short orphan grace so the freeing test does not wait 5 s.
TEST_ORPHAN_GRACE_S = 1.0
#: How long a cancelled service may take to stop (it removes its sockets).
STOP_WAIT_S = 30.0

MOUNT = Mount(container_path="/var/run/cam", host_path="/run/cam", read_only=True)
DEVICE = DeviceSpec(container_path="/dev/cam0", host_path="/dev/video0", permissions="rw")


# -- parts ---------------------------------------------------------------------------------


@dataclass
class AgentNode:
    """One emulated node with the device-plugin side of its agent running."""

    emulator: NodeEmulator
    table: NodeDeviceTable
    metrics: AgentMetrics
    task: asyncio.Task[None]

    @property
    def name(self) -> str:
        return self.emulator.node_name

    def counter(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(str(control_plane.kubeconfig)))
    yield client
    await client.close()


@pytest.fixture
async def pod_namespace(namespace: str, kube: AsyncClient) -> str:
    async def has_account() -> bool:
        try:
            await kube.get(ServiceAccount, "default", namespace=namespace)
        except ApiError:
            return False
        return True

    await wait_until(has_account, what=f"ServiceAccount default in {namespace}")
    return namespace


@pytest.fixture
async def start_node(
    control_plane: ControlPlane, kube: AsyncClient
) -> AsyncIterator[Callable[[], Awaitable[AgentNode]]]:
    started: list[AgentNode] = []
    dirs: list[str] = []

    async def start() -> AgentNode:
        # Short paths: a Unix socket path must fit in 108 bytes.
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-dp-", dir="/tmp"))
        pod_resources_dir = Path(tempfile.mkdtemp(prefix="ep-pr-", dir="/tmp"))
        dirs.extend([str(plugin_dir), str(pod_resources_dir)])
        emulator = NodeEmulator(
            node_name=f"emu-{uuid.uuid4().hex[:8]}",
            kubeconfig=control_plane.kubeconfig,
            plugin_dir=plugin_dir,
            pod_resources_socket=pod_resources_dir / "kubelet.sock",
        )
        await emulator.start()
        table, metrics = NodeDeviceTable(), AgentMetrics()
        task = asyncio.create_task(
            serve_device_plugins(
                client=kube,
                node_name=emulator.node_name,
                plugin_dir=plugin_dir,
                pod_resources_socket=pod_resources_dir / "kubelet.sock",
                devices=table,
                metrics=metrics,
                orphan_grace=TEST_ORPHAN_GRACE_S,
            )
        )
        node = AgentNode(emulator=emulator, table=table, metrics=metrics, task=task)
        started.append(node)
        return node

    yield start
    try:
        for node in started:
            node.task.cancel()
            done, _ = await asyncio.wait([node.task], timeout=STOP_WAIT_S)
            assert done, f"the device-plugin service of {node.name} did not stop when cancelled"
            await node.emulator.stop(delete_node=True)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


# -- helpers -------------------------------------------------------------------------------


async def wait_until(check: Callable[[], Awaitable[bool]], *, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"waited {WAIT_S:.0f}s for {what}")
        await asyncio.sleep(POLL_S)


async def create_instance(
    kube: AsyncClient,
    namespace: str,
    *,
    configuration: str,
    digest: str,
    nodes: list[str],
    capacity: int,
    shared: bool = False,
) -> str:
    name = f"{configuration}-{digest}"
    await kube.create(
        InstanceResource.from_dict(
            {
                "apiVersion": "edgeplug.io/v1alpha1",
                "kind": "Instance",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "configurationName": configuration,
                    "cdiName": f"edgeplug.io/{configuration}={digest}",
                    "capacity": capacity,
                    "shared": shared,
                    "nodes": nodes,
                    "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": f"desc-{digest}"},
                },
            }
        )
    )
    return name


def node_device(namespace: str, configuration: str, instance: str) -> NodeDevice:
    digest = instance.rpartition("-")[2]
    return NodeDevice(
        instance=instance,
        namespace=namespace,
        configuration=configuration,
        properties={"DEBUG_ECHO_DESCRIPTION": f"desc-{digest}"},
        mounts=(MOUNT,),
        device_specs=(DEVICE,),
        cdi_name=f"edgeplug.io/{configuration}={digest}",
    )


async def read_instance(kube: AsyncClient, namespace: str, name: str) -> Instance:
    return Instance.from_object(
        as_dict(await kube.get(InstanceResource, name, namespace=namespace))
    )


async def wait_allocatable(kube: AsyncClient, node: str, resource: str, value: str) -> None:
    async def check() -> bool:
        obj = await kube.get(Node, node)
        return obj.status is not None and (obj.status.allocatable or {}).get(resource) == value

    await wait_until(check, what=f"node {node} allocatable {resource}={value}")


async def create_pod(
    kube: AsyncClient,
    namespace: str,
    name: str,
    limits: Mapping[str, str],
    *,
    node: str | None = None,
) -> None:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "registry.invalid/pause:1", "resources": {"limits": limits}}
        ]
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod = Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )
    await kube.create(cast(Pod, pod))


async def wait_pod(
    kube: AsyncClient, namespace: str, name: str, check: Callable[[Pod], bool], what: str
) -> Pod:
    seen: list[Pod] = []

    async def probe() -> bool:
        pod = await kube.get(Pod, name, namespace=namespace)
        seen[:] = [pod]
        return check(pod)

    try:
        await wait_until(probe, what=f"pod {namespace}/{name} {what}")
    except AssertionError:
        raise AssertionError(
            f"pod {namespace}/{name} never {what}; last status {seen[0].status if seen else None}"
        ) from None
    return seen[0]


def running(pod: Pod) -> bool:
    return pod.status is not None and pod.status.phase == "Running"


def unschedulable(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in conditions
    )


async def assert_no_admission_errors(kube: AsyncClient, namespace: str) -> None:
    async for pod in kube.list(Pod, namespace=namespace):
        assert pod.status is not None
        assert pod.status.reason != ADMISSION_ERROR, f"{pod.metadata}: {pod.status.message}"
        assert pod.status.phase != "Failed", f"pod failed: {pod.status.message}"


# -- tests ---------------------------------------------------------------------------------


async def test_instance_and_configuration_resources_allocate_claim_and_free(
    kube: AsyncClient, pod_namespace: str, start_node: Callable[[], Awaitable[AgentNode]]
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    node = await start_node()
    one = await create_instance(
        kube, ns, configuration=configuration, digest="a1a1a1", nodes=[node.name], capacity=2
    )
    two = await create_instance(
        kube, ns, configuration=configuration, digest="b2b2b2", nodes=[node.name], capacity=2
    )
    for name in (one, two):
        await node.table.put(node_device(ns, configuration, name))
    res_one, res_conf = f"edgeplug.io/{one}", f"edgeplug.io/{configuration}"
    await wait_allocatable(kube, node.name, res_one, "2")
    await wait_allocatable(kube, node.name, res_conf, "4")

    # A pod requesting the Instance's resource: scheduled, Running, given the device.
    await create_pod(kube, ns, "by-instance", {res_one: "1"})
    await wait_pod(kube, ns, "by-instance", running, "Running")
    [allocation] = node.emulator.allocations(ns, "by-instance")
    assert dict(allocation.envs) == {
        "DEBUG_ECHO_DESCRIPTION": "desc-a1a1a1",
        "DEBUG_ECHO_DESCRIPTION_A1A1A1": "desc-a1a1a1",
    }
    assert allocation.mounts == (("/var/run/cam", "/run/cam", True),)
    assert allocation.devices == (("/dev/cam0", "/dev/video0", "rw"),)
    assert allocation.cdi_devices == (f"edgeplug.io/{configuration}=a1a1a1",)
    [slot] = allocation.device_ids
    assert (await read_instance(kube, ns, one)).spec.device_usage[slot] == node.name

    # A pod requesting the configuration-level resource: free slots of distinct Instances.
    await create_pod(kube, ns, "by-configuration", {res_conf: "2"})
    await wait_pod(kube, ns, "by-configuration", running, "Running")
    [vdevs] = node.emulator.allocations(ns, "by-configuration")
    usage = {
        **(await read_instance(kube, ns, one)).spec.device_usage,
        **(await read_instance(kube, ns, two)).spec.device_usage,
    }
    held = {s: v for s, v in usage.items() if v.startswith("C:")}
    assert sorted(held.values()) == sorted(f"C:{v}:{node.name}" for v in vdevs.device_ids)
    assert {s.rpartition("-")[0] for s in held} == {one, two}, "one slot on each Instance"
    assert set(vdevs.cdi_devices) == {
        f"edgeplug.io/{configuration}=a1a1a1",
        f"edgeplug.io/{configuration}=b2b2b2",
    }
    assert vdevs.envs["DEBUG_ECHO_DESCRIPTION_B2B2B2"] == "desc-b2b2b2"
    assert node.counter("edgeplug_allocations_total", resource=res_one, outcome="ok") == 1

    async def used_counted() -> bool:
        obj = as_dict(await kube.get(InstanceResource, one, namespace=ns))
        return (obj.get("status") or {}).get("used") == 2

    await wait_until(used_counted, what=f"status.used of {one} = 2 (kubectl get instances)")

    # Deleting the pod frees its slot after the grace.
    await kube.delete(Pod, "by-instance", namespace=ns)

    async def freed() -> bool:
        return (await read_instance(kube, ns, one)).spec.device_usage.get(slot) == ""

    await wait_until(freed, what=f"slot {slot} freed in deviceUsage")

    # The Instance goes: its plugin and socket go.
    await kube.delete(InstanceResource, two, namespace=ns)
    sock = node.emulator.plugin_dir / socket_name(f"edgeplug.io/{two}")

    async def socket_gone() -> bool:
        return not sock.exists()

    await wait_until(socket_gone, what=f"plugin socket {sock} removed")


async def test_prepare_runs_before_start_and_unknown_ids_are_refused(
    kube: AsyncClient, pod_namespace: str, start_node: Callable[[], Awaitable[AgentNode]]
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    node = await start_node()
    name = await create_instance(
        kube, ns, configuration=configuration, digest="c3c3c3", nodes=[node.name], capacity=1
    )
    prepared: list[str] = []

    async def prepare() -> None:
        prepared.append(name)

    await node.table.put(replace(node_device(ns, configuration, name), prepare=prepare))
    resource = f"edgeplug.io/{name}"
    await wait_allocatable(kube, node.name, resource, "1")
    [registration] = [r for r in node.emulator.registrations if r.resource_name == resource]
    assert registration.pre_start_required
    assert registration.get_preferred_allocation_available

    # Called directly, as a kubelet would: an id that is no slot of the Instance.
    sock = node.emulator.plugin_dir / socket_name(resource)
    async with aio.insecure_channel(f"unix://{sock}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"{name}-7"])]
                ),
                timeout=WAIT_S,
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert f"{name}-7" in details, details
    assert "unknown device id" in details, details
    assert (await read_instance(kube, ns, name)).spec.device_usage.get(f"{name}-7") is None
    assert node.counter("edgeplug_allocations_total", resource=resource, outcome="refused") == 1

    # A pod: the kubelet asks for PreStartContainer and the device's prepare step runs.
    await create_pod(kube, ns, "prepared", {resource: "1"})
    await wait_pod(kube, ns, "prepared", running, "Running")
    assert prepared == [name]


async def test_kubelet_restart_reregisters_every_plugin_and_touches_no_instance(
    kube: AsyncClient, pod_namespace: str, start_node: Callable[[], Awaitable[AgentNode]]
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    node = await start_node()
    name = await create_instance(
        kube, ns, configuration=configuration, digest="d4d4d4", nodes=[node.name], capacity=2
    )
    await node.table.put(node_device(ns, configuration, name))
    resources = {f"edgeplug.io/{name}", f"edgeplug.io/{configuration}"}
    for resource in resources:
        await wait_allocatable(kube, node.name, resource, "2")
    await create_pod(kube, ns, "holder", {f"edgeplug.io/{name}": "1"})
    await wait_pod(kube, ns, "holder", running, "Running")
    # The held slot leaves the configuration-level resource one free virtual device.
    await wait_allocatable(kube, node.name, f"edgeplug.io/{configuration}", "1")
    healthy = {r: sorted(node.emulator.healthy_device_ids(r)) for r in resources}
    before = await read_instance(kube, ns, name)
    registered = len(node.emulator.registrations)

    await node.emulator.restart_kubelet()

    def reregistered() -> set[str]:
        return {r.resource_name for r in node.emulator.registrations[registered:]}

    async def all_back() -> bool:
        return reregistered() == resources and all(
            sorted(node.emulator.healthy_device_ids(r)) == healthy[r] for r in resources
        )

    await wait_until(all_back, what=f"re-registered, healthy devices as before: {healthy}")
    await wait_allocatable(kube, node.name, f"edgeplug.io/{name}", "2")
    await wait_allocatable(kube, node.name, f"edgeplug.io/{configuration}", "1")
    after = await read_instance(kube, ns, name)
    assert after.uid == before.uid
    assert after.spec.device_usage == before.spec.device_usage
    assert node.counter("edgeplug_kubelet_registrations_total", kind="re") >= 2


async def test_two_nodes_never_share_a_slot_and_the_extra_pod_stays_pending(
    kube: AsyncClient, pod_namespace: str, start_node: Callable[[], Awaitable[AgentNode]]
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    a, b = await start_node(), await start_node()
    name = await create_instance(
        kube,
        ns,
        configuration=configuration,
        digest="e5e5e5",
        nodes=[a.name, b.name],
        capacity=2,
        shared=True,
    )
    for node in (a, b):
        await node.table.put(node_device(ns, configuration, name))
    resource = f"edgeplug.io/{name}"
    for node in (a, b):  # one reserved slot each
        await wait_allocatable(kube, node.name, resource, "1")

    await create_pod(kube, ns, "on-a", {resource: "1"}, node=a.name)
    await create_pod(kube, ns, "on-b", {resource: "1"}, node=b.name)
    for pod in ("on-a", "on-b"):
        await wait_pod(kube, ns, pod, running, "Running")
    await create_pod(kube, ns, "extra", {resource: "1"})
    extra = await wait_pod(kube, ns, "extra", unschedulable, "Unschedulable")
    assert extra.status is not None
    assert extra.status.phase == "Pending"
    await assert_no_admission_errors(kube, ns)

    held_a, held_b = (n.emulator.allocated_device_ids(resource) for n in (a, b))
    assert len(held_a) == len(held_b) == 1
    assert not held_a & held_b, "one slot handed out on both nodes"
    usage = (await read_instance(kube, ns, name)).spec.device_usage
    assert usage == {
        **dict.fromkeys(held_a, a.name),
        **dict.fromkeys(held_b, b.name),
    }, "deviceUsage disagrees with what the kubelets allocated"
    for node in (a, b):
        assert node.counter("edgeplug_allocations_total", resource=resource, outcome="refused") == 0
        assert node.counter("edgeplug_slot_conflicts_total", resource=resource) == 0

    # The pending pod gets a slot once one is given back; it never failed.
    await kube.delete(Pod, "on-a", namespace=ns)
    placed = await wait_pod(kube, ns, "extra", running, "Running")
    assert placed.spec is not None
    assert placed.spec.nodeName == a.name
    await assert_no_admission_errors(kube, ns)
    held_a, held_b = (n.emulator.allocated_device_ids(resource) for n in (a, b))
    assert not held_a & held_b

    # Node a leaves the Instance: its plugin and socket go, and so does its usage.
    await kube.patch(
        InstanceResource,
        name,
        {"spec": {"nodes": [b.name]}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    sock = a.emulator.plugin_dir / socket_name(resource)

    async def withdrawn() -> bool:
        usage = (await read_instance(kube, ns, name)).spec.device_usage
        return not sock.exists() and a.name not in usage.values()

    await wait_until(withdrawn, what=f"{a.name} withdrawn: socket removed, usage freed")
    assert set((await read_instance(kube, ns, name)).spec.device_usage.values()) == {"", b.name}
