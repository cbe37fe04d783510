"""An agent is sent only the Instances its node serves: the API server filters by its label.

Real parts: the API server, the agent as its own process (``python -m agent.main``), and where
its device plugins run, the kubelet's own device manager (``DeviceNode``). What is checked:

- writes to other nodes' Instances (created, their slots and status written, deleted) reach
  the agent's Instance watch 0 times, counted by the agent's own
  ``edgeplug_watch_events_total{kind="Instance"}``; a write to its own Instance still does;
- a node that sees a shared device after another node published its Instance joins it (the
  name is deterministic: create, 409, apply) and serves it, though no watch of it ever saw
  the Instance before it joined;
- Instances an agent without labels left for this node (a local one still present, holding a
  slot; a local one whose device is gone; a shared one whose device is gone) are labelled at
  start, adopted, and kept, deleted or left as a restart keeps, deletes or leaves them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.kube.client import InstanceResource, as_dict, field_manager
from agent.kube.node_instances import serves_label
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import allocatable, wait_allocatable
from tests.harness.metrics_scrape import scrape
from tests.harness.stand_ins import node_dirs, running_node

pytestmark = pytest.mark.timeout(180)

INSTANCE_EVENTS = 'edgeplug_watch_events_total{kind="Instance"}'
#: Instances of another node the test writes while the agent runs.
FOREIGN = 6
#: A value of status.used the agent's display corrector puts right (a served Instance's).
WRONG_USED = 7


@contextlib.asynccontextmanager
async def _agent_on_a_kubelet(cp: ControlPlane, ns: str, log: Path,
                              env: dict[str, str]) -> AsyncIterator[str]:
    """A kubelet stand-in's node with the agent (device plugins on) running on it; its name."""
    with node_dirs() as dirs:
        async with running_node(DeviceNode, cp.kubeconfig, dirs) as node:
            agent = harness.AgentSubprocess(
                cp, node_name=node.node_name, namespace=ns, serve_device_plugins=True,
                plugin_dir=dirs.plugin_dir, log_path=log,
                extra_env={**env, "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket)})
            agent.start()
            try:
                yield node.node_name
            finally:
                agent.stop()


async def _read(kube: AsyncClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return as_dict(await kube.get(InstanceResource, name, namespace=ns))
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


async def _events(port: int) -> float | None:
    try:
        return scrape(port).get(INSTANCE_EVENTS)
    except OSError:
        return None  # the agent is still starting its metrics server


async def _marker_round(kube: AsyncClient, ns: str, name: str, port: int) -> float:
    """Write the agent's own served Instance once (a wrong ``status.used``) and wait until the
    agent has put it right and received the echo of its own write: its Instance watch has then
    received everything sent before the marker. The agent's count of Instance events then."""
    before = await harness.eventually(lambda: _events(port), what="the agent's /metrics")
    await kube.patch(InstanceResource.Status, name, {"status": {"used": WRONG_USED}}, namespace=ns,
                     patch_type=PatchType.MERGE)

    async def corrected() -> bool:
        obj = await _read(kube, ns, name)
        return obj is not None and (obj.get("status") or {}).get("used") == 0

    await harness.eventually(corrected, what=f"the agent correcting status.used of {name}")

    async def echoed() -> float | None:
        count = await _events(port)
        return count if count is not None and count >= before + 2 else None

    return await harness.eventually(echoed, what="the marker and the agent's correction "
                                    "counted by the agent's Instance watch")


async def _foreign_writes(kube: AsyncClient, ns: str, other: str) -> int:
    """Instances of node ``other`` created, written (slots, status) and deleted as other
    nodes' agents and the controller would; the number of writes."""
    writes = 0
    for index in range(FOREIGN):
        shared = index % 2 == 0
        name = f"theirs-{index}"
        slot = slot_id(name, 0)
        await kube.create(InstanceResource.from_dict({
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {serves_label(other): "true"}},
            "spec": {"configurationName": "theirs", "cdiName": f"edgeplug.io/theirs={index}",
                     "capacity": 1, "shared": shared, "nodes": [other],
                     "deviceUsage": {slot: ""}, "brokerProperties": {}},
        }))
        await kube.patch(InstanceResource, name, {"spec": {"deviceUsage": {slot: other}}},
                         namespace=ns, patch_type=PatchType.MERGE)
        await kube.patch(InstanceResource.Status, name, {"status": {"demand": {other: 1}}},
                         namespace=ns, patch_type=PatchType.MERGE)
        writes += 3
        if not shared:
            await kube.delete(InstanceResource, name, namespace=ns)
            writes += 1
    return writes


async def test_writes_to_other_nodes_instances_reach_no_watch_of_this_agent(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns, port = namespace, free_port()
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "mine", descriptions=["dev0"], shared=False))
    env = {"METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"}
    async with _agent_on_a_kubelet(control_plane, ns, tmp_path / "agent.log", env) as me:
        name = instance_name("mine", "dev0", shared=False, node=me)
        await wait_allocatable(kube, me, instance_resource_name(name), "1")
        own = await _read(kube, ns, name)
        assert own is not None
        assert own["metadata"]["labels"] == {serves_label(me): "true"}
        baseline = await _marker_round(kube, ns, name, port)
        writes = await _foreign_writes(kube, ns, "node-elsewhere")
        after = await _marker_round(kube, ns, name, port)
    # The marker and the agent's own correction only: none of the foreign writes.
    assert after - baseline == 2, (baseline, after, writes)


async def test_a_node_that_sees_a_shared_device_late_joins_and_serves_its_instance(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns = namespace
    first = harness.new_node(control_plane)
    name = instance_name("cams", "cam0", shared=True, node="")
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "cams", descriptions=["cam0"], shared=True, capacity=2))
    early = harness.AgentSubprocess(control_plane, node_name=first, namespace=ns,
                                    log_path=tmp_path / "first.log")
    early.start()
    try:
        async def published() -> dict[str, Any] | None:
            obj = await _read(kube, ns, name)
            return obj if obj is not None and obj["spec"].get("nodes") == [first] else None

        await harness.eventually(published, what=f"{first} publishing {name}")
        async with _agent_on_a_kubelet(control_plane, ns, tmp_path / "late.log", {}) as late:
            # Served by the late node (its kubelet counts the resource, whatever its share of
            # the slots): its labelled watch brought the Instance.
            await harness.eventually(
                lambda: allocatable(kube, late, instance_resource_name(name)),
                what=f"{late}'s kubelet counting {instance_resource_name(name)}")
            joined = await _read(kube, ns, name)
            assert joined is not None
            assert sorted(joined["spec"]["nodes"]) == sorted([first, late])
            assert set(joined["metadata"]["labels"]) == {serves_label(first), serves_label(late)}
    finally:
        early.stop()


async def test_instances_left_without_labels_are_labelled_and_adopted(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns = namespace
    me = harness.new_node(control_plane)
    kept = instance_name("mine", "dev0", shared=False, node=me)
    gone = instance_name("mine", "dev9", shared=False, node=me)
    left = instance_name("cams", "cam9", shared=True, node="")
    cfg = harness.debug_echo_configuration("mine", descriptions=["dev0"], shared=False)
    cams = harness.debug_echo_configuration("cams", descriptions=["cam0"], shared=True, grace=1)
    harness.apply(control_plane, ns, cfg, cams)
    uids = {}
    # As an agent without labels left them: a local Instance created naming its node, a shared
    # one created without nodes, each node's element applied by that node's field manager.
    for instance, configuration, shared, nodes, holder in (
            (kept, "mine", False, [me], me), (gone, "mine", False, [me], ""),
            (left, "cams", True, [], "node-elsewhere")):
        created = await kube.create(InstanceResource.from_dict({
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
            "metadata": {"name": instance, "namespace": ns},
            "spec": {"configurationName": configuration, "cdiName": f"edgeplug.io/x={instance}",
                     "capacity": 1, "shared": shared, "nodes": nodes,
                     "deviceUsage": {slot_id(instance, 0): holder}, "brokerProperties": {}},
        }))
        uids[instance] = as_dict(created)["metadata"]["uid"]
    for node in (me, "node-elsewhere"):
        await kube.patch(InstanceResource, left, {
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
            "metadata": {"name": left, "namespace": ns}, "spec": {"nodes": [node]}},
            namespace=ns, patch_type=PatchType.APPLY, field_manager=field_manager(node))
    agent = harness.AgentSubprocess(control_plane, node_name=me, namespace=ns,
                                    log_path=tmp_path / "agent.log")
    agent.start()
    try:
        async def settled() -> dict[str, dict[str, Any] | None] | None:
            found = {n: await _read(kube, ns, n) for n in (kept, gone, left)}
            mine, theirs = found[kept], found[left]
            if (mine is None or serves_label(me) not in (mine["metadata"].get("labels") or {})
                    or found[gone] is not None or theirs is None
                    or theirs["spec"]["nodes"] != ["node-elsewhere"]
                    or serves_label(me) in (theirs["metadata"].get("labels") or {})):
                return None
            return found

        found = await harness.eventually(settled, what="the unlabelled Instances labelled, "
                                         "the present one kept, the gone ones deleted or left",
                                         deadline=60.0)
    finally:
        agent.stop()
    mine = found[kept]
    assert mine is not None
    assert mine["metadata"]["uid"] == uids[kept]
    assert mine["spec"]["deviceUsage"] == {slot_id(kept, 0): me}  # its slot kept
    theirs = found[left]
    assert theirs is not None
    assert theirs["metadata"]["uid"] == uids[left]
    assert theirs["spec"]["deviceUsage"] == {slot_id(left, 0): "node-elsewhere"}
