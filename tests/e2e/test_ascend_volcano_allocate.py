"""Allocate honours the chips Volcano chose: a pod bound with Volcano's annotations gets the
chips they name, not the kubelet's choice, and a pod naming a chip another pod holds is refused
with a message naming that chip.

Real control plane, the kubelet's own device manager, admission and pod-resources
(``DeviceNode``), the agent in this process with the DCMI stand-in (Huawei's C ABI;
tests/harness/ascend_dcmi) for the node's NPUs. The pods carry what Volcano's Ascend plugin
writes before binding (``huawei.com/Ascend910: Ascend910-<phy>,...``, ``predicate-time`` in
nanoseconds) and are bound by ``spec.nodeName``, as Volcano binds them to the node it chose.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from tests.e2e.test_ascend_npus import RESOURCE, ascend_node, configuration, npu_pod
from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library
from tests.harness.controller_process import apply
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import running, wait_allocatable, wait_pod

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
pytestmark = pytest.mark.timeout(180)


def volcano_pod(namespace: str, name: str, node: str, chips: list[int]) -> dict[str, Any]:
    """A pod as Volcano's Ascend plugin leaves it when it binds it to ``node``."""
    pod = npu_pod(namespace, name, len(chips))
    pod["metadata"]["annotations"] = {
        RESOURCE: ",".join(f"Ascend910-{chip}" for chip in chips),
        "predicate-time": str(time.time_ns()),
    }
    pod["spec"]["nodeName"] = node
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def _failed(pod: Pod) -> bool:
    return pod.status is not None and pod.status.phase == "Failed"


async def test_allocate_gives_the_chips_volcano_chose_or_refuses_naming_them(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    dcmi_library: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = AscendNode(tmp_path / "host", chips_910b(4, per_card=2), library=dcmi_library)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    resources_dir = Path(tempfile.mkdtemp(prefix="ep-npu-vol-", dir="/tmp"))
    async with ascend_node(control_plane, namespace, plugin_dir, host, DeviceNode,
                           pod_resources=resources_dir / "kubelet.sock") as (
            node, emulator, kube):
        apply(control_plane, configuration(namespace, "ascend-910", host,
                                           resourceName=RESOURCE))
        await wait_allocatable(kube, node, RESOURCE, "4")

        # Chips 3 and 1 (two cards): the kubelet's ranking would give one card's two chips.
        apply(control_plane, volcano_pod(namespace, "chosen", node, [3, 1]))
        await wait_pod(kube, namespace, "chosen", running, "Running")
        [allocation] = emulator.allocations(namespace, "chosen")
        assert allocation.envs["ASCEND_VISIBLE_DEVICES"] == "3,1"

        # Chip 3 is held: a pod Volcano placed on it (a stale view) is refused, naming it.
        apply(control_plane, volcano_pod(namespace, "stale", node, [3]))
        refused = await wait_pod(kube, namespace, "stale", _failed, "Failed at admission")
        assert refused.status is not None
        message = refused.status.message or ""
        assert "Volcano's choice for pod" in message, message
        assert "Ascend910-3 is not free on this node" in message, message

        # A chip this node does not have.
        apply(control_plane, volcano_pod(namespace, "elsewhere", node, [7]))
        away = await wait_pod(kube, namespace, "elsewhere", _failed, "Failed at admission")
        assert away.status is not None
        assert "Ascend910-7 not on this node" in (away.status.message or "")

        # Without Volcano's annotations the kubelet's choice stands.
        apply(control_plane, npu_pod(namespace, "plain", 1))
        await wait_pod(kube, namespace, "plain", running, "Running")
        [plain] = emulator.allocations(namespace, "plain")
        assert plain.envs["ASCEND_VISIBLE_DEVICES"] in {"0", "2"}
