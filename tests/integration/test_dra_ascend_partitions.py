"""A chip split by the scheduler: DRA partitionable devices on the real control plane.

An Ascend 310P chip (8 AI cores, 24 GiB) offered as ``Ascend310P-4c`` and ``Ascend310P-2c``
partitions (``vnpuPartitions``): its pool carries one counter set (``aicore: 8``,
``memory: 24Gi``) and each partition consumes from it (4c: 4 and 12Gi, 2c: 2 and 6Gi). The
real kube-scheduler allocates a 4c and a 2c claim on the chip; a second 4c claim, for which a
free 4c device is still listed, would need 10 of 8 AI cores and stays unschedulable. On a
cluster whose API server drops the counters (DRAPartitionableDevices off: the compatibility
run's oldest minor), the agent names the gate once and publishes no partition.

Prepared through the agent's DRA kubelet plugin, called over its socket as the kubelet's DRA
manager calls it, each allocated partition becomes a vNPU of its template made on the chip
(DCMI's ``dcmi_create_vdevice``), which its claim's CDI device gives as Huawei's plugin gives a
vNPU; unprepare destroys it; a creation DCMI refuses leaves no vNPU, spec or record.

Stands in for real parts: the chip (the DCMI stand-in, tests/harness/ascend_node.py, loaded by
the in-process agent through ctypes) and the node (a Ready Node object without a kubelet,
``tests.harness.dra``). The API server, the controller-manager and the scheduler are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from lightkube import AsyncClient
from lightkube.types import PatchType

from agent.dra import claims as cl
from agent.dra import slices
from agent.dra.plugin import ClaimPreparer
from agent.dra.publisher import ResourceSliceResource
from agent.kube.client import as_dict
from agent.kube.node_reads import NodeReads
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from crds import dra, dra_features
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.ascend_node import AscendNode, SimChip, dcmi_library
from tests.harness.controlplane import ControlPlane
from tests.integration.test_dra_kubelet_plugin import plugin_running

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
SCHEDULE_DEADLINE = 60.0


@pytest.fixture
def chip(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    host = AscendNode(tmp_path / "host", [SimChip(card=0, dev=0, logic=0, phy=0, name="310P3",
                                                  aicore=8, hbm_mb=0, mem_mb=24576)],
                      library=dcmi_library)
    for name, value in host.env.items():
        monkeypatch.setenv(name, value)
    return host


async def counters_kept(kube: AsyncClient, namespace: str) -> bool:
    """Whether the API server keeps a slice's ``sharedCounters`` (asked with a dry run)."""
    probe: dict[str, Any] = {
        "apiVersion": dra.API_VERSION, "kind": "ResourceSlice",
        "metadata": {"name": f"probe-{namespace}"},
        "spec": {"driver": dra.DRIVER, "allNodes": True,
                 "pool": {"name": f"probe-{namespace}", "generation": 1,
                          "resourceSliceCount": 1},
                 "sharedCounters": [{"name": "c", "counters": {"aicore": {"value": "1"}}}]},
    }
    resource: Any = ResourceSliceResource
    stored = await kube.patch(resource, probe["metadata"]["name"], probe,
                              patch_type=PatchType.APPLY, field_manager="test-probe",
                              dry_run=True)
    return bool(as_dict(stored)["spec"].get("sharedCounters"))


def reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    feature = dra_features.PARTITIONABLE_DEVICES
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and f"does not serve {feature}" in r.getMessage()]


async def published(kube: AsyncClient, pool: str) -> list[dict[str, Any]] | None:
    """The pool's newest generation once all its slices are there with the chip's six
    partitions (they are written one by one; the scheduler too waits for a complete
    generation)."""
    found = await h.pool_slices(kube, pool)
    newest = max((s["spec"]["pool"]["generation"] for s in found), default=0)
    found = [s for s in found if s["spec"]["pool"]["generation"] == newest]
    complete = bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]
    return found if complete and len(h.pool_devices(found)) == 6 else None


def partitions_configuration(chip: AscendNode) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "npu"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": chip.details(
            vnpuPartitions=["Ascend310P-4c", "Ascend310P-2c"])},
                 "capacity": 1, "allocator": "dra"},
    }


def wants(kind: str) -> str:
    attr = f'device.attributes["{dra.DRIVER}"]'
    return f'"ascend_vnpu_type" in {attr} && {attr}.ascend_vnpu_type == "{kind}"'


async def test_claims_for_a_4c_and_a_2c_share_one_chip_and_a_third_that_would_overcommit_waits(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, chip: AscendNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = pod_namespace
    served = await counters_kept(kube, ns)
    node = harness.new_node(control_plane)
    cfg = partitions_configuration(chip)
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, cfg)
        pool = slices.local_pool(ns, "npu", node)
        if not served:
            async def reported() -> list[str] | None:
                return reports(caplog) or None

            await harness.eventually(reported, what="the agent naming DRAPartitionableDevices")

            async def withdrawn() -> bool | None:
                return not h.pool_devices(await h.pool_slices(kube, pool)) or None

            await harness.eventually(withdrawn, what="no partition left published")
            assert len(reports(caplog)) == 1
            return

        found = await harness.eventually(lambda: published(kube, pool),
                                         what=f"six partitions in pool {pool}")
        (sets,) = [s["spec"]["sharedCounters"] for s in found if "sharedCounters" in s["spec"]]
        assert sets == [{"name": "davinci0",
                         "counters": {"aicore": {"value": "8"}, "memory": {"value": "24Gi"}}}]
        by_type: dict[str, list[dict[str, Any]]] = {}
        for device in h.pool_devices(found).values():
            kind = device["attributes"]["ascend_vnpu_type"]["string"]
            by_type.setdefault(kind, []).append(device)
        assert {k: len(v) for k, v in by_type.items()} == {"Ascend310P-4c": 2,
                                                            "Ascend310P-2c": 4}
        assert by_type["Ascend310P-4c"][0]["consumesCounters"] == [{
            "counterSet": "davinci0",
            "counters": {"aicore": {"value": "4"}, "memory": {"value": "12Gi"}}}]
        await harness.eventually(lambda: h.device_class(kube, ns, "npu"),
                                 what="the DeviceClass of npu")

        klass = dra.device_class_name(ns, "npu")
        h.apply(control_plane, ns, h.claim_template("four", klass, wants("Ascend310P-4c")),
                h.claim_template("two", klass, wants("Ascend310P-2c")),
                h.claim_pod("four-a", "four"), h.claim_pod("two-a", "two"))
        for pod in ("four-a", "two-a"):
            got = await harness.eventually(lambda p=pod: h.pod_claim(kube, ns, p),  # type: ignore[misc]
                                           what=f"pod {pod} bound with its partition",
                                           deadline=SCHEDULE_DEADLINE)
            assert got.node == node
        h.apply(control_plane, ns, h.claim_pod("four-b", "four"))
        why = await harness.eventually(lambda: h.unschedulable(kube, ns, "four-b"),
                                       what="the second 4c claim unschedulable",
                                       deadline=SCHEDULE_DEADLINE)
        assert await h.pod_claim(kube, ns, "four-b") is None, why
        assert reports(caplog) == []


def vnpu_given(spec: dict[str, Any], vdev: int) -> bool:
    """Whether a claim's CDI spec gives vNPU ``vdev`` as Huawei's plugin gives one: its node
    as ``/dev/davinci<id>``, the shared manager node, its id and the runtime's VIRTUAL."""
    env = spec["containerEdits"]["env"]
    (device,) = spec["devices"]
    nodes = device["containerEdits"]["deviceNodes"]
    return (f"ASCEND_VISIBLE_DEVICES={vdev}" in env
            and "ASCEND_RUNTIME_OPTIONS=VIRTUAL" in env
            and nodes[0] == {"path": f"/dev/davinci{vdev}", "hostPath": f"/dev/vdavinci{vdev}",
                             "permissions": "rwm"}
            and "/dev/davinci_manager" in {n["path"] for n in nodes[1:]})


async def test_preparing_a_4c_and_a_2c_claim_makes_a_vnpu_for_each_and_unprepare_destroys_them(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, chip: AscendNode,
    tmp_path: Path,
) -> None:
    ns = pod_namespace
    # Run on a version that serves partitionable devices (the suite's newest; the test above
    # checks what the agent does where they are not served).
    assert await counters_kept(kube, ns), "this API server drops sharedCounters"
    node = harness.new_node(control_plane)
    cdi_dir, state_dir = tmp_path / "cdi", tmp_path / "plugins" / dra.DRIVER
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns) as agents):
        harness.apply(control_plane, ns, partitions_configuration(chip))
        pool = slices.local_pool(ns, "npu", node)
        await harness.eventually(lambda: published(kube, pool),
                                 what=f"six partitions in pool {pool}")
        await harness.eventually(lambda: h.device_class(kube, ns, "npu"),
                                 what="the DeviceClass of npu")
        klass = dra.device_class_name(ns, "npu")
        h.apply(control_plane, ns, h.claim_template("four", klass, wants("Ascend310P-4c")),
                h.claim_template("two", klass, wants("Ascend310P-2c")),
                h.claim_pod("four-a", "four"), h.claim_pod("two-a", "two"),
                h.claim_pod("two-b", "two"))
        four, two, refused = [await h.allocated_claim(kube, ns, pod)
                              for pod in ("four-a", "two-a", "two-b")]
        preparer = ClaimPreparer(reads=NodeReads(kube), node_name=node,
                                 devices=agents[node].agent.devices, cdi_dir=cdi_dir,
                                 state_dir=state_dir)
        async with (plugin_running(preparer, tmp_path) as plugin,
                    grpc.aio.insecure_channel(f"unix:{plugin.service_socket}") as channel):
            stub = pb_grpc.DRAPluginStub(channel)
            answer = await stub.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[four, two]))
            assert [answer.claims[c.uid].error for c in (four, two)] == ["", ""]
            made = {template: vdev for _, _, vdev, template in chip.created_vnpus()}
            assert sorted(made) == ["vir02", "vir04"], chip.created_vnpus()
            for claim, template in ((four, "vir04"), (two, "vir02")):
                spec = cl.read_claim_spec(cdi_dir, claim.uid)
                assert spec is not None
                assert vnpu_given(spec, made[template]), spec
                assert (chip.root / "dev" / f"vdavinci{made[template]}").exists()
                (recorded,) = preparer.checkpoint.claims[claim.uid].devices
                assert recorded.made["vnpu"] == str(made[template])

            # The agent restarted: the record answers, no vNPU is made again.
            again = ClaimPreparer(reads=NodeReads(kube), node_name=node,
                                  devices=agents[node].agent.devices, cdi_dir=cdi_dir,
                                  state_dir=state_dir)
            assert (await again.prepare(four.namespace, four.name, four.uid)
                    ) == preparer.checkpoint.claims[four.uid]
            assert len(chip.created_vnpus()) == 2

            # DCMI refuses the third vNPU: the claim is refused naming chip and template,
            # and nothing of it is left.
            chip.fail("dcmi_create_vdevice", -8005)
            answer = await stub.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[refused]))
            error = answer.claims[refused.uid].error
            assert "chip davinci0, template vir02" in error
            assert "dcmi_create_vdevice returned -8005" in error
            assert len(chip.created_vnpus()) == 2
            assert refused.uid not in preparer.checkpoint.claims
            assert cl.read_claim_spec(cdi_dir, refused.uid) is None

            undone = await stub.NodeUnprepareResources(
                pb.NodeUnprepareResourcesRequest(claims=[four, two]))
            assert [undone.claims[c.uid].error for c in (four, two)] == ["", ""]
            assert chip.created_vnpus() == []
            assert not any((chip.root / "dev" / f"vdavinci{v}").exists()
                           for v in made.values())
            assert preparer.checkpoint.claims == {}
