"""A device served both ways: the device plugins withhold the slot a ResourceClaim holds.

Real parts: the kubelet's own device manager, admission and pod-resources (``DeviceNode``), the
agent as its own process with ``DRA=on`` and its device plugins, the controller process with
``--dra`` (DeviceClasses, ``status.claims``), the real kube-scheduler allocating the claim and
the real kube-controller-manager making it from a template and removing it with its pod.
(``DeviceNode`` has no DRA manager: the claim's pod is admitted without preparing it, which
does not matter here.) ``agent.slots.rules``, "DRA claims", states the rule and its window.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from agent.dra import slices
from agent.kube import InstanceResource, as_dict
from agent.slots.ledger import SlotLedger, SlotUnavailable
from agent.slots.rules import Verdict
from crds import dra
from crds.instance import SlotUsage
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.agent_nodes import create_instance, read_instance
from tests.harness.controller_process import FAST_ARGS
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import WaitTimedOut, wait_allocatable, wait_until
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
async def test_a_claim_on_a_device_served_both_ways_keeps_extended_resource_pods_pending(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns = pod_namespace
    log = tmp_path / "agent.log"
    with node_dirs() as dirs:
        async with running_node(DeviceNode, control_plane.kubeconfig, dirs) as node:
            name = instance_name("dual", "dev0", shared=False, node=node.node_name)
            resource = instance_resource_name(name)
            agent = harness.AgentSubprocess(
                control_plane, node_name=node.node_name, namespace=ns,
                serve_device_plugins=True, plugin_dir=dirs.plugin_dir, log_path=log,
                extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",  # slices, no kubelet plugin
                           "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket)})
            harness.apply(control_plane, ns, harness.debug_echo_configuration(
                "dual", descriptions=["dev0"], shared=False, capacity=1))
            agent.start()
            try:
                await _run(control_plane, kube, ns, node, name, resource)
            except AssertionError as error:
                shown = [(i["spec"].get("deviceUsage"), i.get("status"))
                         for i in (await harness.instances(kube, ns)).values()]
                raise AssertionError(
                    f"{error}\n{await h.describe(kube, ns)}\nInstances: {shown}"
                    f"\n--- agent log ---\n{log.read_text()[-3000:]}") from None
            finally:
                agent.stop()


async def _run(cp: ControlPlane, kube: AsyncClient, ns: str, node: DeviceNode, name: str,
               resource: str) -> None:
    config_resource = "edgeplug.io/dual"
    # Served both ways: the kubelet offers the slot, the scheduler sees the device.
    await wait_allocatable(kube, node.node_name, resource, "1")
    await wait_allocatable(kube, node.node_name, config_resource, "1")
    device = await harness.eventually(lambda: _device(kube, ns, node.node_name, name),
                                      what=f"{name} in a ResourceSlice")
    assert "taints" not in device
    await harness.eventually(lambda: h.device_class(kube, ns, "dual"), what="DeviceClass")

    # A claim from a template: the scheduler allocates the device, the pod is bound.
    h.apply(cp, ns, h.claim_template("dual", dra.device_class_name(ns, "dual"),
                                     dra.instance_selector(name)),
            h.claim_pod("holder", "dual"))
    got = await harness.eventually(lambda: h.pod_claim(kube, ns, "holder"),
                                   what="holder bound, its claim allocated",
                                   deadline=SCHEDULE_DEADLINE)
    allocated = time.monotonic()
    assert got.node == node.node_name
    assert [r["device"] for r in got.results] == [name]

    # The device plugins withhold the slot: both extended resources drop to 0.
    await wait_allocatable(kube, node.node_name, resource, "0")
    withheld = time.monotonic() - allocated
    await wait_allocatable(kube, node.node_name, config_resource, "0")
    # The agent lowers the Node's count before it withdraws the slot from the kubelet (the
    # give-away gate, agent/slots/handoff.py), so the count alone does not say the kubelet's
    # own list is down to nothing yet (read at the count, it could still hold the slot): wait
    # for the kubelet to say so, as the kubelet-restart test of test_device_plugin_service does.
    withdrawn: dict[str, list[str]] = {resource: [], config_resource: []}

    def kubelet_view() -> dict[str, list[str]]:
        return {r: node.healthy_device_ids(r) for r in withdrawn}

    async def kubelet_withdrew() -> bool:
        return kubelet_view() == withdrawn

    try:
        await wait_until(kubelet_withdrew, what="the kubelet listing no healthy device")
    except WaitTimedOut as timed_out:
        raise WaitTimedOut(f"{timed_out}; the kubelet lists {kubelet_view()}") from None
    instance = (await harness.instances(kube, ns))[name]
    assert instance["status"]["claims"] == 1
    assert instance["spec"].get("deviceUsage", {}).get(slot_id(name, 0), "") == ""

    # Pods asking for either extended resource wait: Unschedulable, never bound, never failed.
    h.apply(cp, ns, h.extended_resource_pod("waiter", resource),
            h.extended_resource_pod("any", config_resource))
    for pod in ("waiter", "any"):
        why = await harness.eventually(functools.partial(h.unschedulable, kube, ns, pod),
                                       what=f"{pod} Unschedulable", deadline=SCHEDULE_DEADLINE)
        assert "Insufficient edgeplug.io/" in why, why
    for pod in ("waiter", "any"):
        body = await _pod(kube, ns, pod)
        assert body["status"].get("phase") == "Pending"
        assert not body["spec"].get("nodeName")
        assert not node.pod_admitted(ns, pod)
        assert node.pod_failure(ns, pod) is None

    # The claim's pod goes, its claim with it (deallocated): the slot is offered again and the
    # waiting pod runs on it. (One waiter only: two pods on the two resources of one slot are
    # issue 21's known limit, agent.slots.rules "Two resources, one slot".)
    cp.kubectl("delete", "pod", "any", "holder", "-n", ns, "--grace-period=0", "--force")
    gone = time.monotonic()

    async def running() -> bool:
        phase = (await _pod(kube, ns, "waiter"))["status"].get("phase")
        assert phase != "Failed", node.pod_failure(ns, "waiter")
        return bool(phase == "Running")

    await harness.eventually(running, what="waiter Running", deadline=SCHEDULE_DEADLINE)
    released = time.monotonic() - gone
    assert await _claims(kube, ns) == []
    (allocation,) = node.allocations(ns, "waiter")
    assert (allocation.resource_name, allocation.device_ids) == (resource, (slot_id(name, 0),))
    # And the other direction (agent.dra.slices): the slot the device plugin handed out is
    # taken out of what DRA offers.
    await harness.eventually(lambda: _held_taint(kube, ns, node.node_name, name),
                             what="the device tainted edgeplug.io/held")
    print(f"claim allocated -> extended resource withheld: {withheld:.2f} s; "
          f"claim's pod deleted -> device-plugin pod Running: {released:.2f} s")


def _local_pool(ns: str, node: str) -> str:
    return slices.local_pool(ns, "dual", node)


async def _device(kube: AsyncClient, ns: str, node: str, name: str) -> dict[str, Any] | None:
    """The Instance's device in this node's pool as published now; None before it is."""
    return h.pool_devices(await h.pool_slices(kube, _local_pool(ns, node))).get(name)


async def _held_taint(kube: AsyncClient, ns: str, node: str, name: str) -> bool:
    device = await _device(kube, ns, node, name) or {}
    return [t["key"] for t in device.get("taints", [])] == [slices.TAINT_HELD]


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
