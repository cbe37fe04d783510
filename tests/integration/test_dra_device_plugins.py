"""A local device has one allocator: with DRA it is the scheduler, and no device plugin
advertises it; the device plugins' slot records still guard a switch of allocator.

Real parts: the kubelet's own device manager, admission and pod-resources (``DeviceNode``), the
agent as its own process with ``DRA=on`` and its device plugins, the controller process with
``--dra`` (DeviceClasses, the allocator choice), the real kube-scheduler allocating claims (a
pod's own, and the ones it makes for extended resources) and the real kube-controller-manager
making them from a template and removing them with their pods. (``DeviceNode`` has no DRA
manager: a claim's pod is admitted without preparing it; what a container gets through a claim
is the real node's test, ``tests/e2e/test_realnode_dra.py``.)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from agent.deviceplugins.slots.ledger import SlotLedger, SlotUnavailable
from agent.deviceplugins.slots.rules import Verdict
from agent.dra import slices
from agent.kube.client import InstanceResource, as_dict
from controller.dra.instance_classes import DeviceClassResource
from crds import dra
from crds.instance import SlotUsage
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.agent_nodes import create_instance, read_instance
from tests.harness.controller_process import FAST_ARGS
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.dra import PodClaim
from tests.harness.stand_ins import node_dirs, running_node

pytestmark = [pytest.mark.timeout(120)]

#: The scheduler retries an unschedulable pod after a backoff; the machine is shared.
SCHEDULE_DEADLINE = 60.0


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*FAST_ARGS, "--dra")


async def _pod(kube: AsyncClient, ns: str, name: str) -> dict[str, Any]:
    return as_dict(await kube.get(Pod, name, namespace=ns))


async def _claims(kube: AsyncClient, ns: str) -> list[dict[str, Any]]:
    return [as_dict(c) async for c in kube.list(h.ResourceClaimResource, namespace=ns)]


@pytest.mark.usefixtures("controller")
async def test_a_local_device_the_scheduler_allocates_is_advertised_by_no_device_plugin(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns = pod_namespace
    log = tmp_path / "agent.log"
    with node_dirs() as dirs:
        async with running_node(DeviceNode, control_plane.kubeconfig, dirs) as node:
            name = instance_name("dual", "dev0", shared=False, node=node.node_name)
            agent = harness.AgentSubprocess(
                control_plane, node_name=node.node_name, namespace=ns,
                serve_device_plugins=True, plugin_dir=dirs.plugin_dir, log_path=log,
                extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",  # slices, no kubelet plugin
                           "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket)})
            harness.apply(control_plane, ns, harness.debug_echo_configuration(
                "dual", descriptions=["dev0"], shared=False, capacity=1))
            agent.start()
            try:
                await _one_allocator(control_plane, kube, ns, node, name)
            except AssertionError as error:
                shown = [(i["spec"].get("deviceUsage"), i.get("status"))
                         for i in (await harness.instances(kube, ns)).values()]
                raise AssertionError(
                    f"{error}\n{await h.describe(kube, ns)}\nInstances: {shown}"
                    f"\n--- agent log ---\n{log.read_text()[-3000:]}") from None
            finally:
                agent.stop()


async def _allocatable(kube: AsyncClient, node: str) -> dict[str, str]:
    body = as_dict(await kube.get(Node, node))
    return {k: v for k, v in ((body.get("status") or {}).get("allocatable") or {}).items()
            if k.startswith(dra.DRIVER)}


async def _one_allocator(cp: ControlPlane, kube: AsyncClient, ns: str, node: DeviceNode,
                         name: str) -> None:
    resource, config_resource = instance_resource_name(name), "edgeplug.io/dual"
    # The scheduler's: the device in this node's pool, its Configuration's name mapped.
    device = await harness.eventually(lambda: _device(kube, ns, node.node_name, name),
                                      what=f"{name} in a ResourceSlice")
    assert "taints" not in device
    config_class = await harness.eventually(lambda: h.device_class(kube, ns, "dual"),
                                            what="the Configuration's DeviceClass")
    assert config_class["spec"]["extendedResourceName"] == config_resource
    assert await _class(kube, dra.instance_class_name(ns, name)) is None, \
        "the Instance's own name mapped before any pod asked for it"
    # ... and no device plugin's: the kubelet was offered neither resource.
    assert await _allocatable(kube, node.node_name) == {}
    assert node.healthy_device_ids(resource) == node.healthy_device_ids(config_resource) == []

    # A claim of the pod's own and two pods asking for the extended resources, capacity 1:
    # the scheduler gives the one slot once; the others wait, never bound, never failed.
    h.apply(cp, ns, h.claim_template("dual", dra.device_class_name(ns, "dual"),
                                     dra.instance_selector(name)),
            h.claim_pod("holder", "dual"))
    got = await harness.eventually(lambda: h.pod_claim(kube, ns, "holder"),
                                   what="holder bound, its claim allocated",
                                   deadline=SCHEDULE_DEADLINE)
    assert (got.node, [r["device"] for r in got.results]) == (node.node_name, [name])
    h.apply(cp, ns, h.extended_resource_pod("waiter", resource),
            h.extended_resource_pod("any", config_resource))
    # A pod asking for the Instance's own name: its class is made, mapping it.
    instance_class = await harness.eventually(
        lambda: _class(kube, dra.instance_class_name(ns, name)), what="the Instance's class")
    assert instance_class["spec"]["extendedResourceName"] == resource
    for pod in ("waiter", "any"):
        await harness.eventually(functools.partial(h.unschedulable, kube, ns, pod),
                                 what=f"{pod} Unschedulable", deadline=SCHEDULE_DEADLINE)
        body = await _pod(kube, ns, pod)
        assert body["status"].get("phase") == "Pending"
        assert not body["spec"].get("nodeName")
        assert node.pod_failure(ns, pod) is None

    # The holder goes, its claim with it: one waiter gets the slot through a claim the
    # scheduler makes, the other still waits; no device plugin ever handed anything out.
    cp.kubectl("delete", "pod", "holder", "-n", ns, "--grace-period=0", "--force")
    bound: dict[str, PodClaim] = {}

    async def one_bound() -> bool:
        for pod in ("waiter", "any"):
            claim = await h.pod_claim(kube, ns, pod)
            if claim is not None:
                bound[pod] = claim
        return bool(bound)

    await harness.eventually(one_bound, what="a waiter bound", deadline=SCHEDULE_DEADLINE)
    (winner, claim), = bound.items()
    assert [r["device"] for r in claim.results] == [name]
    loser = ({"waiter", "any"} - {winner}).pop()
    assert await h.unschedulable(kube, ns, loser) is not None
    assert not (await _pod(kube, ns, loser))["spec"].get("nodeName")
    for pod in ("waiter", "any"):
        assert node.allocations(ns, pod) == []
        assert node.pod_failure(ns, pod) is None
    instance = (await harness.instances(kube, ns))[name]
    assert set((instance["spec"].get("deviceUsage") or {}).values()) <= {""}


async def _class(kube: AsyncClient, name: str) -> dict[str, Any] | None:
    try:
        return as_dict(await kube.get(DeviceClassResource, name))
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


def _local_pool(ns: str, node: str) -> str:
    return slices.local_pool(ns, "dual", node)


async def _device(kube: AsyncClient, ns: str, node: str, name: str) -> dict[str, Any] | None:
    """The Instance's device in this node's pool as published now; None before it is."""
    return h.pool_devices(await h.pool_slices(kube, _local_pool(ns, node))).get(name)


async def test_a_slot_left_to_claims_is_refused_to_a_new_claim_but_recorded_for_its_pod(
    kube: AsyncClient, namespace: str,
) -> None:
    """On the real API server: a device-plugin claim of the slot a ResourceClaim holds is
    refused on the object it would change; a slot a pod already has (a fast-path promise being
    recorded, a slot adopted after a crash) is recorded even though claims now withhold it."""
    name = await create_instance(kube, namespace, configuration="dual", digest="c1a1b1",
                                 nodes=["node-a"], capacity=2)
    await kube.patch(InstanceResource.Status, name, {"status": {"claims": 1}},
                     namespace=namespace, patch_type=PatchType.MERGE)
    ledger = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    mine = SlotUsage.by_node("node-a")
    withheld = slot_id(name, 1)  # the highest free slot
    with pytest.raises(SlotUnavailable) as refused:
        async with ledger.lock:
            await ledger.claim({withheld: mine})
    assert refused.value.verdict is Verdict.HELD_BY_CLAIMS
    assert "claims=1" in str(refused.value)
    async with ledger.lock:
        await ledger.claim({slot_id(name, 0): mine})  # the other slot is free to take
        # Now slot 0 is held, and slot 1 (the only free one) is the claim's; a pod that
        # already has it is recorded all the same.
        recorded = await ledger.claim({withheld: mine}, held_by_pod=True)
    assert recorded.spec.device_usage == {slot_id(name, 0): "node-a", withheld: "node-a"}
    assert (await read_instance(kube, namespace, name)).claims == 1
