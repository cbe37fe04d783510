"""The standard attributes reach the scheduler: Ascend NPUs found through the DCMI
stand-in, on a host tree whose sysfs places their PCI bus ids below a root complex with NUMA
nodes, are published with ``resource.kubernetes.io/pcieRoot`` and ``numaNode``, and a claim
selecting by NUMA node is allocated the chip on it (real API server and scheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient

from agent.dra import slices
from crds import dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library
from tests.harness.controlplane import ControlPlane

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
SCHEDULE_DEADLINE = 60.0


@pytest.fixture
def npu_host(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    host = AscendNode(tmp_path / "host", chips_910b(2), library=dcmi_library)
    host.pci_sysfs({0: 0, 1: 1})
    for name, value in host.env.items():
        monkeypatch.setenv(name, value)
    return host


async def test_npus_carry_pcie_root_and_numa_node_and_a_claim_selects_by_them(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, npu_host: AscendNode
) -> None:
    ns = pod_namespace
    node = harness.new_node(control_plane)
    cfg: dict[str, Any] = {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "npu"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": npu_host.details()},
                 "capacity": 1, "allocator": "dra"},
    }
    pool = slices.local_pool(ns, "npu", node)
    chip = {phy: instance_name("npu", f"davinci{phy}", shared=False, node=node)
            for phy in (0, 1)}
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, cfg)

        async def published() -> dict[str, dict[str, Any]] | None:
            devices = h.pool_devices(await h.pool_slices(kube, pool))
            return devices if len(devices) == 2 else None

        devices = await harness.eventually(published, what=f"{pool} published")
        for phy in (0, 1):
            attributes = devices[slices.device_name(chip[phy])]["attributes"]
            assert attributes[dra.ATTR_PCIE_ROOT] == {"string": "pci0000:c0"}
            assert attributes[dra.ATTR_NUMA_NODE] == {"int": phy}
        cel = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
        h.apply(control_plane, ns, h.claim_template("numa1", dra.device_class_name(ns, "npu"),
                                                    cel),
                h.claim_pod("on-numa-1", "numa1"))
        got = await harness.eventually(lambda: h.pod_claim(kube, ns, "on-numa-1"),
                                       what="pod on-numa-1 bound", deadline=SCHEDULE_DEADLINE)
        assert [r["device"] for r in got.results] == [slices.device_name(chip[1])]
