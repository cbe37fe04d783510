"""DRA objects over time: the controller's DeviceClasses follow Configurations (the controller
process, ``--dra``); an agent restart rewrites no unchanged pool; the controller's pool of a
shared device follows its nodes' health and a node leaving, keeping its identity, so a claim
allocated before still counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDeviceTable
from agent.dra import slices
from agent.dra.publisher import DraPublisher, ResourceSliceResource
from agent.kube.client import as_dict
from controller.dra.instance_classes import DeviceClassResource
from crds import dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness import echo_handlers
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane

SCHEDULE_DEADLINE = 60.0


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*FAST_ARGS, "--dra")


async def test_the_controller_keeps_a_device_class_per_configuration(
    controller: ControllerProcess, control_plane: ControlPlane, namespace: str,
    kube: AsyncClient,
) -> None:
    cfg = harness.debug_echo_configuration("cls", descriptions=["a"])
    harness.apply(control_plane, namespace, cfg)
    body = await harness.eventually(lambda: h.device_class(kube, namespace, "cls"),
                                    what="the DeviceClass of cls", deadline=30.0)
    (selector,) = body["spec"]["selectors"]
    assert selector["cel"]["expression"] == dra.device_selector(namespace, "cls")
    # A class left by a Configuration deleted while no controller ran is swept at start; one
    # whose Configuration lives is re-made if deleted by hand.
    await kube.delete(DeviceClassResource, dra.device_class_name(namespace, "cls"))
    controller.stop()
    stale = dra.device_class(namespace, "gone-while-down")
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(stale))
    controller.start()
    await harness.eventually(lambda: h.device_class(kube, namespace, "cls"),
                             what="the DeviceClass of cls again", deadline=30.0)

    async def swept() -> bool:
        return await h.device_class(kube, namespace, "gone-while-down") is None

    await harness.eventually(swept, what="the stale DeviceClass deleted", deadline=30.0)
    control_plane.kubectl("delete", "configuration", "cls", "-n", namespace)

    async def deleted() -> bool:
        return await h.device_class(kube, namespace, "cls") is None

    await harness.eventually(deleted, what="the DeviceClass deleted with cls", deadline=30.0)


async def test_an_agent_restart_rewrites_no_unchanged_pool(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient
) -> None:
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "keep", descriptions=["a", "b"], shared=False, allocator="dra"))
    pool = slices.local_pool(namespace, "keep", node)
    try:
        async with h.dra_agents(control_plane, [node], namespace) as agents:
            async def published() -> bool:
                return len(h.pool_devices(await h.pool_slices(kube, pool))) == 2

            await harness.eventually(published, what=f"two devices in {pool}")
            (before,) = await h.pool_slices(kube, pool)
            client = agents[node].agent.client
            # A restarted agent's publisher may pass before its Configuration watch has told
            # it the allocator (here: never): the pool it published stays as it is.
            early = DraPublisher(client=client, node_name=node, namespace=namespace,
                                 devices=NodeDeviceTable())
            task = asyncio.create_task(early.run())
            try:
                async def first_pass() -> bool:
                    return early.passes >= 1 and len(early.known_instances()) == 2

                await harness.eventually(first_pass, what="an undecided publisher's first pass")
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert early.writes == 0
        async with h.dra_agents(control_plane, [node], namespace) as agents:
            again = agents[node].publisher

            async def settled() -> bool:
                return again.passes >= 1 and len(again.known_instances()) == 2

            await harness.eventually(settled, what="the restarted publisher's first pass")
            assert again.writes == 0
            (after,) = await h.pool_slices(kube, pool)
            assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    finally:
        await h.delete_slices(kube, node)


async def test_a_shared_devices_selector_follows_health_and_a_node_leaving_keeps_its_claims(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient
) -> None:
    ns = pod_namespace
    node_a, node_b = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "hand", descriptions=["cam"], capacity=1))
    name = instance_name("hand", "cam", shared=True, node=node_a)
    pool = slices.shared_pool(ns, "hand", name)
    async with (h.ready_nodes(kube, [node_a, node_b]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node_a, node_b], ns) as agents):
        async def selecting(*nodes: str) -> dict[str, Any] | None:
            """The pool's one slice, the controller's, once it selects exactly ``nodes``."""
            found = await h.pool_slices(kube, pool)
            if len(found) != 1:
                return None
            (body,) = found
            return body if h.device_nodes(found, slices.device_name(name)) == list(nodes) \
                else None

        first = await harness.eventually(lambda: selecting(node_a, node_b), deadline=30.0,
                                         what=f"{pool} published for both nodes")
        assert first["metadata"]["labels"][dra.LABEL_MANAGED_BY] == "edgeplug-controller"
        assert slices.LABEL_NODE not in first["metadata"]["labels"]
        await harness.eventually(lambda: h.device_class(kube, ns, "hand"), what="class")
        h.apply(control_plane, ns, h.claim_template("cam", dra.device_class_name(ns, "hand")),
                h.claim_pod("holder", "cam"))
        held = await harness.eventually(lambda: h.pod_claim(kube, ns, "holder"),
                                        what="holder bound", deadline=SCHEDULE_DEADLINE)
        assert [r["device"] for r in held.results] == [name]

        # Node A's agent finds it unhealthy (written as its agent writes it): A leaves the
        # selector; healthy again, A is back.
        def health(verdict: str | None) -> None:
            control_plane.kubectl(
                "patch", "instances.edgeplug.io", name, "-n", ns, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"unhealthy": {node_a: verdict}}}))

        health("no answer to SOAP")
        await harness.eventually(lambda: selecting(node_b), deadline=30.0,
                                 what=f"{pool} selecting {node_b} alone")
        health(None)
        await harness.eventually(lambda: selecting(node_a, node_b), deadline=30.0,
                                 what=f"{pool} selecting both again")

        # Node A's agent stops discovering it (leaves the Instance): same pool and device,
        # B alone, one generation up.
        await agents[node_a].agent.watch.runs[(ns, "hand")].stop(withdraw=True)
        last = await harness.eventually(lambda: selecting(node_b), deadline=30.0,
                                        what=f"{pool} selecting {node_b} once {node_a} left")
        assert [d["name"] for d in last["spec"]["devices"]] == [slices.device_name(name)]
        assert last["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]
        # Capacity 1, held by the claim made before: a new claim waits.
        h.apply(control_plane, ns, h.claim_pod("second", "cam"))
        why = await harness.eventually(lambda: h.unschedulable(kube, ns, "second"),
                                       what="pod second unschedulable",
                                       deadline=SCHEDULE_DEADLINE)
        assert await h.pod_claim(kube, ns, "second") is None, why


async def test_a_shared_pool_an_agent_published_before_is_taken_over_by_the_controller(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient
) -> None:
    """The upgrade: a slice of a shared pool as an older agent left it (its node's label) is
    replaced by the controller's, one generation up, and deleted by the controller; the new
    agent neither adopts nor deletes it."""
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "upgrade", descriptions=["cam"], capacity=2))
    name = instance_name("upgrade", "cam", shared=True, node=node)
    pool = slices.single_device_pool(namespace, "upgrade", name)  # an older release's
    old: dict[str, Any] = {"apiVersion": dra.API_VERSION, "kind": "ResourceSlice",
           "metadata": {"name": slices.slice_name(pool, 0, node),
                        "labels": {slices.LABEL_POOL: slices.pool_label(pool),
                                   slices.LABEL_NODE: node,
                                   dra.LABEL_MANAGED_BY: "edgeplug-agent"}},
           "spec": {"driver": dra.DRIVER, "pool": {"name": pool, "generation": 7,
                                                   "resourceSliceCount": 1},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In",
                         "values": [node]}]}]},
                    "devices": [{"name": slices.device_name(name), "attributes": {
                        "namespace": {"string": namespace},
                        "configuration": {"string": "upgrade"}}}]}}
    await kube.create(ResourceSliceResource.from_dict(old))

    async def listed() -> bool:  # the agent's verdict (its node listed): the pool has its device
        found = (await harness.instances(kube, namespace)).get(name) or {}
        return node in ((found.get("spec") or {}).get("nodes") or [])

    async def taken_over() -> dict[str, Any] | None:
        found = await h.pool_slices(kube, pool)
        return found[0] if len(found) == 1 and found[0]["metadata"]["name"] != \
            old["metadata"]["name"] else None

    async with h.ready_nodes(kube, [node]), h.dra_agents(control_plane, [node], namespace):
        # As in an upgrade, the device's Instance is there when the controller starts.
        await harness.eventually(listed, what=f"Instance {name} listing {node}")
        async with h.device_classes(kube, namespace):
            body = await harness.eventually(taken_over, deadline=30.0,
                                            what=f"{pool}: the controller's slice alone")
            assert body["spec"]["pool"]["generation"] == 8
            assert body["metadata"]["labels"][dra.LABEL_MANAGED_BY] == "edgeplug-controller"
            # It stays in the pool claims allocated before name, and is offered there alone.
            assert await h.pool_slices(
                kube, slices.shared_pool(namespace, "upgrade", name)) == []


async def test_a_slice_deleted_by_someone_else_is_published_again(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient
) -> None:
    """As the kubelet does at its start for drivers that have not registered in time."""
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "wiped", descriptions=["a"], shared=False, allocator="dra"))
    pool = slices.local_pool(namespace, "wiped", node)
    try:
        async with h.dra_agents(control_plane, [node], namespace):
            async def generation() -> int | None:
                found = await h.pool_slices(kube, pool)
                return int(found[0]["spec"]["pool"]["generation"]) if len(found) == 1 else None

            first = await harness.eventually(generation, what=f"{pool} published")
            await h.delete_slices(kube, node)

            async def again() -> int | None:
                now = await generation()
                return now if now is not None and now > first else None

            await harness.eventually(again, what=f"{pool} published again, newer")
    finally:
        await h.delete_slices(kube, node)


async def test_a_pool_with_a_tainted_device_is_split_as_the_api_requires(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """A slice holding a tainted device may hold only 64 devices (128 otherwise)."""
    node = harness.new_node(control_plane)
    state = tmp_path / "state.json"
    echo_handlers.write_state(state, {"d00": {"healthy": False, "reason": "fault"}})
    handler = echo_handlers.install()
    names = [f"d{i:02d}" for i in range(70)]
    cfg = h.extended_echo_configuration("big", names, state)
    pool = slices.local_pool(namespace, "big", node)
    sick = slices.device_name(instance_name("big", "d00", shared=False, node=node))
    written: list[dict[str, Any]] = []  # every slice of the pool the API server stored

    async def record() -> None:
        async for kind, obj in kube.watch(
                ResourceSliceResource, labels={slices.LABEL_POOL: slices.pool_label(pool)}):
            if kind != "DELETED":
                written.append(as_dict(obj))

    recorder = asyncio.create_task(record())
    try:
        async with h.dra_agents(control_plane, [node], namespace):
            harness.apply(control_plane, namespace, cfg)

            async def split() -> list[int] | None:
                found = await h.pool_slices(kube, pool)
                sizes = sorted((len(s["spec"]["devices"]) for s in found), reverse=True)
                return sizes if sum(sizes) == len(names) else None

            assert await harness.eventually(split, what=f"{pool}: 70 devices",
                                            deadline=60.0) == [64, 6]
        # Never, not for a moment, was the unhealthy device published without its taint (the
        # pool as one slice of 70: its Instances are written before the status saying so).
        untainted = [(s["metadata"]["name"], s["spec"]["pool"]["generation"],
                      len(s["spec"]["devices"])) for s in written
                     for d in s["spec"]["devices"] if d["name"] == sick and not d.get("taints")]
        assert untainted == [], f"{sick} published as healthy: (slice, generation, devices)"
        assert written, "the recorder saw no slice"
    finally:
        recorder.cancel()
        await asyncio.gather(recorder, return_exceptions=True)
        handler.release()
        await h.delete_slices(kube, node)
