"""The agent's device plugins against the real control plane and the emulated kubelet.

Instances are created directly in the API server, NodeDevices are put in a table, and
``serve_device_plugins`` runs as ``agent.main`` runs it; the node emulator (real gRPC over Unix
sockets, real scheduler placing the pods) plays the kubelet. Every wait polls the API or the
emulator with a deadline and fails saying what it expected.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import grpc
import pytest
from grpc import aio
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from agent.deviceplugins.slots.service import socket_name
from agent.kube.client import InstanceResource, as_dict
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from crds.naming import LABEL_TARGET_NODE, target_node_label
from tests.harness import echo_handlers
from tests.harness.agent_nodes import (
    StartNode,
    create_instance,
    node_device,
    read_instance,
    share_instance,
)
from tests.harness.kube_waits import (
    WAIT_S,
    WaitTimedOut,
    running,
    unschedulable,
    wait_allocatable,
    wait_pod,
    wait_until,
)
from tests.harness.node_emulator import ADMISSION_ERROR

pytestmark = pytest.mark.timeout(180)

# -- helpers -------------------------------------------------------------------------------


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
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if node is not None:
        # Pinned and labelled as the controller pins and labels broker pods.
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        metadata["labels"] = {LABEL_TARGET_NODE: target_node_label(node)}
    pod = Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
        }
    )
    await kube.create(cast(Pod, pod))


async def run_pod(kube: AsyncClient, namespace: str, name: str, limits: Mapping[str, str]) -> Pod:
    """Create a pod with these device limits and return it once it runs."""
    await create_pod(kube, namespace, name, limits)
    return await wait_pod(kube, namespace, name, running, "Running")


async def assert_no_admission_errors(kube: AsyncClient, namespace: str) -> None:
    async for pod in kube.list(Pod, namespace=namespace):
        assert pod.status is not None
        assert pod.status.reason != ADMISSION_ERROR, f"{pod.metadata}: {pod.status.message}"
        assert pod.status.phase != "Failed", f"pod failed: {pod.status.message}"


# -- tests ---------------------------------------------------------------------------------


async def test_instance_and_configuration_resources_allocate_claim_and_free(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
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
    await run_pod(kube, ns, "by-instance", {res_one: "1"})
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
    await run_pod(kube, ns, "by-configuration", {res_conf: "2"})
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
    # Counted per Configuration and kind of resource: one Allocate each way.
    assert node.allocations(ns, configuration) == 1
    assert node.allocations(ns, configuration, kind="configuration") == 1

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
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    node = await start_node()
    name = await create_instance(
        kube, ns, configuration=configuration, digest="c3c3c3", nodes=[node.name], capacity=1
    )
    handler = echo_handlers.ExtendedEcho()
    echo_details = handler.parse_details("descriptions: [d0]", {})
    record = node_device(ns, configuration, name)
    await node.table.put(replace(record, handler=handler, details=echo_details))
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
    assert node.allocations(ns, configuration, outcome="refused") == 1

    # A pod: the kubelet asks for PreStartContainer and the device's prepare step runs.
    await run_pod(kube, ns, "prepared", {resource: "1"})
    assert handler.prepared == [[record.device.id]]


async def test_kubelet_restart_reregisters_every_plugin_and_touches_no_instance(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
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
    # The held slot leaves the configuration-level resource one free virtual device. The agent
    # lowers the Node's count before it withdraws the device from the kubelet (the give-away
    # gate, agent/deviceplugins/crossnode/handoff.py), so the count alone does not say the kubelet's
    # own list is down to it: the baseline is taken once the kubelet says so too. Taken at the
    # count, it once held the device being withdrawn (v0 and v1), which no restarted kubelet
    # lists.
    await wait_allocatable(kube, node.name, f"edgeplug.io/{configuration}", "1")
    settled = {f"edgeplug.io/{name}": 2, f"edgeplug.io/{configuration}": 1}

    async def kubelet_settled() -> bool:
        return all(len(node.emulator.healthy_device_ids(r)) == n for r, n in settled.items())

    await wait_until(kubelet_settled, what=f"the kubelet's healthy devices counting {settled}")
    healthy = {r: sorted(node.emulator.healthy_device_ids(r)) for r in resources}
    before = await read_instance(kube, ns, name)
    registered = len(node.emulator.registrations)

    await node.emulator.restart_kubelet()

    def reregistered() -> set[str]:
        return {r.resource_name for r in node.emulator.registrations[registered:]}

    def kubelet_view() -> dict[str, list[str]]:
        return {r: sorted(node.emulator.healthy_device_ids(r)) for r in resources}

    async def all_back() -> bool:
        return reregistered() == resources and kubelet_view() == healthy

    try:
        await wait_until(all_back, what=f"re-registered, healthy devices as before: {healthy}")
    except WaitTimedOut as timed_out:
        raise WaitTimedOut(f"{timed_out}; the restarted kubelet registered "
                           f"{sorted(reregistered())} and lists {kubelet_view()}") from None
    await wait_allocatable(kube, node.name, f"edgeplug.io/{name}", "2")
    await wait_allocatable(kube, node.name, f"edgeplug.io/{configuration}", "1")
    after = await read_instance(kube, ns, name)
    assert after.uid == before.uid
    assert after.spec.device_usage == before.spec.device_usage
    assert node.counter("edgeplug_kubelet_registrations_total", kind="re") >= 2


async def test_two_nodes_never_share_a_slot_and_the_extra_pod_stays_pending(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
) -> None:
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    a, b = await start_node(), await start_node()
    # One reserved slot each.
    name, resource = await share_instance(
        kube, ns, configuration=configuration, digest="e5e5e5", nodes=(a, b), capacity=2
    )

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
        assert node.allocations(ns, configuration) == 1, f"{node.name} answered one pod"
        assert node.allocations(ns, configuration, outcome="refused") == 0
        assert node.slot_conflicts(ns, configuration) == 0

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
