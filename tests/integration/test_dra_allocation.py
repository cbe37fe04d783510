"""DRA end to end on the real control plane: agents publish ResourceSlices, the real
kube-controller-manager makes claims from templates, the real kube-scheduler allocates them.

The nodes are Ready Node objects with no kubelet (``tests.harness.dra``): a pod is bound once
the scheduler allocated its claim, and the claim's allocation names the device. What a
kubelet's DRA manager does next (NodePrepareResources) is not covered here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from agent.dra import slices
from crds import dra
from crds.naming import instance_name, instance_resource_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness import echo_handlers
from tests.harness.controlplane import ControlPlane

#: The scheduler retries an unschedulable pod after backoff; allocation can take a while on
#: the 2-core machine.
SCHEDULE_DEADLINE = 60.0


async def test_a_claim_selecting_one_device_by_attribute_gets_it_on_its_node(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient
) -> None:
    ns = pod_namespace
    node_a, node_b = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    cfg = harness.debug_echo_configuration(
        "cam", descriptions=["10.0.0.7", "10.0.0.8"], shared=False,
        broker_properties={"SITE": "north"},
    )
    async with (h.ready_nodes(kube, [node_a, node_b]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node_a], ns)):
        harness.apply(control_plane, ns, cfg)
        pool = slices.local_pool(ns, "cam", node_a)
        wanted = instance_name("cam", "10.0.0.8", shared=False, node=node_a)

        async def published() -> dict[str, dict[str, object]] | None:
            devices = h.pool_devices(await h.pool_slices(kube, pool))
            return devices if len(devices) == 2 else None

        devices = await harness.eventually(published, what=f"two devices in pool {pool}")
        attrs = devices[wanted]["attributes"]
        assert attrs == {
            "configuration": {"string": "cam"}, "namespace": {"string": ns},
            "instance": {"string": wanted}, "description": {"string": "10.0.0.8"},
            "debug_echo_description": {"string": "10.0.0.8"}, "site": {"string": "north"},
        }
        (body,) = await h.pool_slices(kube, pool)
        assert body["spec"]["nodeName"] == node_a
        assert await harness.eventually(
            lambda: h.device_class(kube, ns, "cam"), what="the DeviceClass of cam")

        cel = f'device.attributes["{dra.DRIVER}"].description == "10.0.0.8"'
        h.apply(control_plane, ns, h.claim_template("cam-b", dra.device_class_name(ns, "cam"),
                                                    cel),
                h.claim_pod("user", "cam-b"))
        got = await harness.eventually(lambda: h.pod_claim(kube, ns, "user"),
                                       what="pod user bound with its claim allocated",
                                       deadline=SCHEDULE_DEADLINE)
        assert got.node == node_a  # the device is local to node A: the pod goes there
        (result,) = got.results
        assert (result["driver"], result["pool"], result["device"]) == (dra.DRIVER, pool, wanted)


async def test_a_shared_device_of_capacity_two_seen_by_two_nodes_takes_two_claims_not_three(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    ns = pod_namespace
    node_a, node_b = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    cfg = harness.debug_echo_configuration("ipcam", descriptions=["cam-1"], capacity=2)
    name = instance_name("ipcam", "cam-1", shared=True, node=node_a)
    pool = slices.shared_pool(ns, "ipcam", name)
    async with (h.ready_nodes(kube, [node_a, node_b]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node_a, node_b], ns)):
        harness.apply(control_plane, ns, cfg)

        async def published_for_both() -> list[dict[str, Any]] | None:
            found = await h.pool_slices(kube, pool)
            if len(found) != 1:
                return None
            nodes = h.device_nodes(found, slices.device_name(name))
            return found if nodes == [node_a, node_b] else None

        # One slice, by the controller (no node's agent), usable on both.
        (body,) = await harness.eventually(published_for_both, deadline=30.0,
                                           what=f"pool {pool}: one slice for both nodes")
        assert body["metadata"]["labels"][dra.LABEL_MANAGED_BY] == "edgeplug-controller"
        assert slices.LABEL_NODE not in body["metadata"]["labels"]
        assert "nodeName" not in body["spec"]
        (device,) = body["spec"]["devices"]
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"][dra.CAPACITY_SLOTS]["value"] == "2"
        await harness.eventually(lambda: h.device_class(kube, ns, "ipcam"),
                                 what="the DeviceClass of ipcam")

        h.apply(control_plane, ns, h.claim_template("cam", dra.device_class_name(ns, "ipcam")))
        pods = ["user-0", "user-1", "user-2"]
        h.apply(control_plane, ns, *(h.claim_pod(p, "cam") for p in pods))

        async def two_bound_one_refused() -> dict[str, object] | None:
            bound = {p: await h.pod_claim(kube, ns, p) for p in pods}
            refused = {p: await h.unschedulable(kube, ns, p) for p in pods}
            placed = {p: c for p, c in bound.items() if c is not None}
            waiting = [p for p, why in refused.items() if why is not None]
            if len(placed) == 2 and len(waiting) == 1:
                return {"placed": placed, "waiting": waiting[0], "why": refused[waiting[0]]}
            return None

        try:
            outcome = await harness.eventually(
                two_bound_one_refused, deadline=SCHEDULE_DEADLINE,
                what="two pods bound with the shared device, the third unschedulable")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{await h.describe(kube, ns)}") from None
        placed = outcome["placed"]
        assert isinstance(placed, dict)
        for claim in placed.values():
            (result,) = claim.results
            assert (result["pool"], result["device"]) == (pool, name)
            assert result["consumedCapacity"] == {dra.CAPACITY_SLOTS: "1"}
            assert result.get("shareID")
        # Still unschedulable (no failure: it waits for a unit to be freed).
        assert await h.unschedulable(kube, ns, str(outcome["waiting"]))


async def test_a_device_that_goes_is_withdrawn_and_not_allocated(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    ns = pod_namespace
    (node,) = [harness.new_node(control_plane)]
    offline = tmp_path / "offline"  # debugEcho's availability file: what is gone
    cfg = harness.debug_echo_configuration("ports", descriptions=["usb0", "usb1"],
                                           shared=False, availability_file=offline)
    pool = slices.local_pool(ns, "ports", node)
    usb1 = instance_name("ports", "usb1", shared=False, node=node)
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, cfg)

        async def devices(count: int) -> dict[str, dict[str, object]] | None:
            found = h.pool_devices(await h.pool_slices(kube, pool))
            return found if len(found) == count else None

        await harness.eventually(lambda: devices(2), what=f"two devices in {pool}")
        generation = (await h.pool_slices(kube, pool))[0]["spec"]["pool"]["generation"]
        offline.write_text("usb1\n")
        left = await harness.eventually(lambda: devices(1), what=f"usb1 withdrawn from {pool}")
        assert usb1 not in left
        (body,) = await h.pool_slices(kube, pool)  # rewritten in place, one slice
        assert body["spec"]["pool"]["generation"] == generation + 1

        cel = f'device.attributes["{dra.DRIVER}"].description == "usb1"'
        h.apply(control_plane, ns, h.claim_template("usb1", dra.device_class_name(ns, "ports"),
                                                    cel),
                h.claim_pod("wants-usb1", "usb1"))
        why = await harness.eventually(lambda: h.unschedulable(kube, ns, "wants-usb1"),
                                       what="pod wants-usb1 unschedulable",
                                       deadline=SCHEDULE_DEADLINE)
        assert await h.pod_claim(kube, ns, "wants-usb1") is None, why

        # It comes back: the pending claim gets it.
        offline.write_text("")
        got = await harness.eventually(lambda: h.pod_claim(kube, ns, "wants-usb1"),
                                       what="pod wants-usb1 bound once usb1 is back",
                                       deadline=SCHEDULE_DEADLINE)
        assert [r["device"] for r in got.results] == [usb1]


async def test_an_unhealthy_device_is_tainted_and_allocated_only_once_healthy(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """debugEchoExtended (tests/harness/echo_handlers.py) stands for any handler that reports
    a device present but unhealthy (an NPU with a fault code, a camera refusing SOAP)."""
    ns = pod_namespace
    (node,) = [harness.new_node(control_plane)]
    state = tmp_path / "state.json"
    echo_handlers.write_state(state, {"b": {"healthy": False, "reason": "fault 0x80"}})
    handler = echo_handlers.install()
    cfg = h.extended_echo_configuration("sick", ["a", "b"], state)
    pool = slices.local_pool(ns, "sick", node)
    b = instance_name("sick", "b", shared=False, node=node)
    try:
        async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                    h.dra_agents(control_plane, [node], ns)):
            harness.apply(control_plane, ns, cfg)

            async def taints() -> list[dict[str, Any]] | None:
                devices = h.pool_devices(await h.pool_slices(kube, pool))
                return devices[b].get("taints") if len(devices) == 2 else None

            (taint,) = await harness.eventually(taints, what=f"{b} published, tainted")
            assert (taint["key"], taint["value"], taint["effect"]) == (
                "edgeplug.io/unhealthy", "fault-0x80", "NoSchedule")
            cel = f'device.attributes["{dra.DRIVER}"].description == "b"'
            h.apply(control_plane, ns, h.claim_template("b", dra.device_class_name(ns, "sick"),
                                                        cel),
                    h.claim_pod("wants-b", "b"))
            await harness.eventually(lambda: h.unschedulable(kube, ns, "wants-b"),
                                     what="pod wants-b unschedulable while b is tainted",
                                     deadline=SCHEDULE_DEADLINE)
            assert await h.pod_claim(kube, ns, "wants-b") is None

            echo_handlers.write_state(state, {})  # b recovers: the taint goes, the claim gets b
            got = await harness.eventually(lambda: h.pod_claim(kube, ns, "wants-b"),
                                           what="pod wants-b bound once b is healthy",
                                           deadline=SCHEDULE_DEADLINE)
            assert [r["device"] for r in got.results] == [b]
    finally:
        handler.release()


async def test_a_pod_asking_for_a_device_by_its_instance_name_gets_a_class_made_for_it(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient
) -> None:
    """No class maps ``edgeplug.io/<instance>`` until a pod asks for it; then one is made and the
    scheduler, retrying the pod on the class's arrival, binds it with that device."""
    ns = pod_namespace
    node = harness.new_node(control_plane)
    name = instance_name("byname", "cam", shared=True, node=node)
    pool = slices.shared_pool(ns, "byname", name)
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, harness.debug_echo_configuration(
            "byname", descriptions=["cam"], shared=True, capacity=1))

        async def published() -> bool:
            return h.device_nodes(await h.pool_slices(kube, pool),
                                  slices.device_name(name)) == [node]

        await harness.eventually(published, what=f"{name} published on {node}")
        await harness.eventually(lambda: h.device_class(kube, ns, "byname"),
                                 what="the Configuration's class")
        assert await h.device_class_named(kube, dra.instance_class_name(ns, name)) is None
        h.apply(control_plane, ns, h.extended_resource_pod("byname", instance_resource_name(name)))
        claim = await harness.eventually(lambda: h.pod_claim(kube, ns, "byname"),
                                         what="the pod bound with its device",
                                         deadline=SCHEDULE_DEADLINE)
        assert (claim.node, [r["device"] for r in claim.results]) == (node, [name])
