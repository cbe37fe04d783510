"""A separated chip moves its job: a Job's pod on a chip that reaches Huawei's ``SeparateNPU``
level is evicted by the agent and the Job's new pod runs on another chip.

Real control plane (scheduler, the Job controller), the kubelet's own device manager and
pod-resources (``DeviceNode``), the agent in this process with the DCMI stand-in (Huawei's C
ABI; tests/harness/ascend_dcmi) for the node's NPUs. A ``RestartBusiness`` fault on another
pod's chip, by contrast, keeps its pod where it is (unhealthy, nothing new placed there).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from tests.e2e.test_ascend_npus import RESOURCE, ascend_node, configuration, npu_pod
from tests.harness.agent_process import eventually
from tests.harness.ascend_node import LEVEL_CODES, AscendNode, chips_910b, dcmi_library
from tests.harness.controller_process import apply
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import running, wait_allocatable, wait_pod, wait_until

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
pytestmark = pytest.mark.timeout(180)
JOB = "train"


def job(namespace: str) -> dict[str, Any]:
    """A one-chip training Job as written for Huawei's device plugin."""
    template = npu_pod(namespace, "unused", 1)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"backoffLimit": 3, "template": {"spec": {
            **template["spec"], "restartPolicy": "Never"}}},
    }


async def _job_pods(kube: AsyncClient, namespace: str) -> list[Pod]:
    return [pod async for pod in kube.list(Pod, namespace=namespace,
                                          labels={"job-name": JOB})]


def _chip(emulator: Any, namespace: str, pod: str) -> str:
    [allocation] = emulator.allocations(namespace, pod)
    chip: str = allocation.envs["ASCEND_VISIBLE_DEVICES"]
    return chip


async def test_a_jobs_pod_on_a_separated_chip_runs_again_on_another(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    dcmi_library: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = AscendNode(tmp_path / "host", chips_910b(4, per_card=2), library=dcmi_library)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    resources_dir = Path(tempfile.mkdtemp(prefix="ep-npu-sep-", dir="/tmp"))
    async with ascend_node(control_plane, namespace, plugin_dir, host, DeviceNode,
                           pod_resources=resources_dir / "kubelet.sock") as (
            node, emulator, kube):
        apply(control_plane, configuration(namespace, "ascend-910", host,
                                           resourceName=RESOURCE,
                                           discoveryHandler={
                                               "name": "ascend",
                                               "discoveryDetails": host.details(
                                                   healthPollSeconds=1)}))
        await wait_allocatable(kube, node, RESOURCE, "4")
        # A pod that only restarts its business on a fault stays put.
        apply(control_plane, npu_pod(namespace, "infer", 1))
        await wait_pod(kube, namespace, "infer", running, "Running")
        kept = _chip(emulator, namespace, "infer")
        apply(control_plane, job(namespace))

        async def first_pod() -> Pod | None:
            pods = [p for p in await _job_pods(kube, namespace)
                    if p.status is not None and p.status.phase == "Running"]
            return pods[0] if pods else None

        pod = await eventually(first_pod, what="the Job's pod Running", deadline=60)
        assert pod.metadata is not None
        first_name = pod.metadata.name or ""
        separated = _chip(emulator, namespace, first_name)

        started = time.monotonic()
        host.fault(int(kept), errors=(LEVEL_CODES["RestartBusiness"],))
        host.fault(int(separated), errors=(LEVEL_CODES["SeparateNPU"],))

        async def moved() -> Pod | None:
            for p in await _job_pods(kube, namespace):
                name = p.metadata.name if p.metadata else None
                if name and name != first_name and p.status and p.status.phase == "Running":
                    return p
            return None

        second = await eventually(moved, what="the Job's new pod Running", deadline=60)
        took = time.monotonic() - started
        assert second.metadata is not None
        chip = _chip(emulator, namespace, second.metadata.name or "")
        assert chip not in {separated, kept}
        print(f"chip separated → the Job's pod Running on chip {chip}: {took:.2f} s")

        async def first_gone() -> bool:
            return first_name not in {p.metadata.name for p in await _job_pods(kube, namespace)
                                      if p.metadata}

        await wait_until(first_gone, what="the pod on the separated chip gone")
        infer = await kube.get(Pod, "infer", namespace=namespace)
        assert infer.metadata is not None
        assert infer.metadata.deletionTimestamp is None
        assert infer.status is not None
        assert infer.status.phase == "Running"
