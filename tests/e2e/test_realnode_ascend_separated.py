"""On a real node: a Job's pod on an Ascend chip that is separated runs again on the other chip.

Stands in for real parts: the NPUs (tests/harness/ascend_dcmi's DCMI stand-in with Huawei's C
signatures; the chips' device nodes are character devices in the node's own ``/dev``, as in
test_realnode_ascend.py). Everything else is real: the agent beside the kubelet (with
``VOLCANO_DEVICE_INFO=on``), the kubelet admitting the pods, containerd and runc running them,
the Job controller replacing the evicted pod, the scheduler placing it. The chip the first pod
got gets a ``SeparateNPU`` error code; the agent evicts the pod and the Job's next pod runs on
the other chip, which its own ``ASCEND_VISIBLE_DEVICES`` shows. The node's device-info
ConfigMap for Volcano lists the separated chip as unhealthy, and the Node's ``baseDeviceInfos``
annotation both chips.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.ascend_node import LEVEL_CODES, SHARED_NODES, AscendNode, SimChip, dcmi_library
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import deployed, plane
from tests.harness.realnode_images import BUSYBOX_IMAGE

__all__ = ["dcmi_library", "plane"]  # the fixtures

pytestmark = pytest.mark.timeout(900)
CHIPS = 2
ZERO, NULL = (1, 5), (1, 3)  # the chips read as /dev/zero, the shared nodes as /dev/null
RESOURCE = "huawei.com/Ascend910"
MARK = "edgeplug-visible="


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, dcmi_library: Path) -> AscendNode:
    chips = [SimChip(card=0, dev=i, logic=i, phy=i) for i in range(CHIPS)]
    return AscendNode(tmp_path_factory.mktemp("ascend") / "host", chips, library=dcmi_library)


@pytest.fixture(scope="module")
def npu_node(plane: ControlPlane, host: AscendNode) -> Iterator[RealNode]:
    nodes = {f"davinci{i}": ZERO for i in range(CHIPS)} | dict.fromkeys(SHARED_NODES, NULL)
    real = RealNode(plane, node_name=f"npu-{uuid.uuid4().hex[:6]}", dev_nodes=nodes,
                    host_dirs={"/usr/local/Ascend/driver":
                               host.root / "usr/local/Ascend/driver"})
    real.start()
    try:
        yield real
    finally:
        real.cleanup()


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 3, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "train", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", f"echo {MARK}$ASCEND_VISIBLE_DEVICES; exec sleep 3600"],
                "resources": {"limits": {RESOURCE: "1"}}}]}}},
    }


def _running_pods(plane: ControlPlane, namespace: str, job: str) -> dict[str, str]:
    """The Job's pods whose container runs and is ready, with the chip each logged."""
    found = json.loads(plane.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={job}",
                                     "-o", "json").stdout)
    chips = {}
    for item in found["items"]:
        statuses = item.get("status", {}).get("containerStatuses") or []
        if item["metadata"].get("deletionTimestamp") or not any(s.get("ready")
                                                                for s in statuses):
            continue
        name = item["metadata"]["name"]
        out = plane.kubectl("logs", "-n", namespace, name, check=False).stdout
        lines = [line for line in out.splitlines() if line.startswith(MARK)]
        if lines:
            chips[name] = lines[0].removeprefix(MARK)
    return chips


async def test_a_jobs_pod_on_a_separated_chip_runs_again_on_the_other_chip(
    plane: ControlPlane, npu_node: RealNode, host: AscendNode, tmp_path: Path,
) -> None:
    details = host.details(healthPollSeconds=1)
    cfg = {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "npu"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": details},
                 "capacity": 1, "resourceName": RESOURCE, "allocator": "devicePlugin"},
    }
    env = {**host.env, "VOLCANO_DEVICE_INFO": "on"}
    with deployed(plane, npu_node, tmp_path, cfg, "unused", agent_env=env,
                  before=[_job("train")]) as broker:
        namespace = broker.namespace

        def first() -> dict[str, str] | None:
            return _running_pods(plane, namespace, "train") or None

        [(first_pod, chip)] = (await until(first, what="the Job's pod running",
                                           within=300)).items()
        started = time.monotonic()
        host.fault(int(chip), errors=(LEVEL_CODES["SeparateNPU"],))

        def moved() -> dict[str, str] | None:
            running = _running_pods(plane, namespace, "train")
            running.pop(first_pod, None)
            return running or None

        [(second_pod, other)] = (await until(moved, what="the Job's new pod running",
                                             within=300)).items()
        took = time.monotonic() - started
        print(f"figure: chip separated -> the Job's new pod running on the other chip "
              f"{took:.1f} s (healthPollSeconds 1)")
        assert other != chip
        assert second_pod != first_pod

        info = json.loads(plane.kubectl(
            "get", "configmap", "-n", "kube-system", f"mindx-dl-deviceinfo-{npu_node.node_name}",
            "-o", "jsonpath={.data.DeviceInfoCfg}").stdout)
        lists = info["DeviceInfo"]["DeviceList"]
        assert lists[f"{RESOURCE}-Unhealthy"] == f"Ascend910-{chip}"
        assert lists[RESOURCE] == "", "the other chip is held by the new pod"
        go_encoding = json.dumps(info["DeviceInfo"], separators=(",", ":"), sort_keys=True)
        assert info["CheckCode"] == hashlib.sha256(go_encoding.encode()).hexdigest()
        print("device-info:", json.dumps(info))
        base = plane.kubectl("get", "node", npu_node.node_name, "-o",
                             "jsonpath={.metadata.annotations.baseDeviceInfos}").stdout
        assert sorted(json.loads(base)) == [f"Ascend910-{phy}" for phy in range(CHIPS)]
