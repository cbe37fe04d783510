"""A chip split by the scheduler: DRA partitionable devices on the real control plane.

An Ascend 310P chip (8 AI cores, 24 GiB) offered as ``Ascend310P-4c`` and ``Ascend310P-2c``
partitions (``vnpuPartitions``): its pool carries one counter set (``aicore: 8``,
``memory: 24Gi``) and each partition consumes from it (4c: 4 and 12Gi, 2c: 2 and 6Gi). The
real kube-scheduler allocates a 4c and a 2c claim on the chip; a second 4c claim, for which a
free 4c device is still listed, would need 10 of 8 AI cores and stays unschedulable. On a
cluster whose API server drops the counters (DRAPartitionableDevices off: the compatibility
run's oldest minor), the agent names the gate once and publishes no partition.

Stands in for real parts: the chip (the DCMI stand-in, tests/harness/ascend_node.py, loaded by
the in-process agent through ctypes) and the node (a Ready Node object without a kubelet,
``tests.harness.dra``). The API server, the controller-manager and the scheduler are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.types import PatchType

from agent.dra import slices
from agent.dra.publisher import ResourceSliceResource
from agent.kube import as_dict
from crds import dra, dra_features
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.ascend_node import AscendNode, SimChip, dcmi_library
from tests.harness.controlplane import ControlPlane

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
    cfg: dict[str, Any] = {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "npu"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": chip.details(
            vnpuPartitions=["Ascend310P-4c", "Ascend310P-2c"])},
                 "capacity": 1, "allocator": "dra"},
    }
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

        async def published() -> list[dict[str, Any]] | None:
            """The pool's newest generation once all its slices are there (they are written
            one by one; the scheduler too waits for a complete generation)."""
            found = await h.pool_slices(kube, pool)
            newest = max((s["spec"]["pool"]["generation"] for s in found), default=0)
            found = [s for s in found if s["spec"]["pool"]["generation"] == newest]
            complete = bool(found) and len(found) == found[0]["spec"]["pool"][
                "resourceSliceCount"]
            return found if complete and len(h.pool_devices(found)) == 6 else None

        found = await harness.eventually(published, what=f"six partitions in pool {pool}")
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
