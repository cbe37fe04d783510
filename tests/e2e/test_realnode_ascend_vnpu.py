"""On a real node: Huawei's static-vNPU job runs unchanged and gets the vNPU as Huawei's plugin
hands it out.

Huawei's docs (static vNPU scheduling) have users take their inference Job sample
(mindcluster-deploy, ``samples/inference/without-volcano/infer.yaml``: a ``batch/v1`` Job, no
service account token, ``/var/log/npu/conf/slog/`` and ``/etc/localtime`` from the host,
``restartPolicy: OnFailure``) and change its resource to the vNPU type, ``huawei.com/
Ascend910-4c: 1``. That Job runs here with only its image and command replaced (busybox
printing what it got). Its container must get what Huawei's plugin gives for vNPU 100 of chip
0: ``ASCEND_VISIBLE_DEVICES=100``, ``ASCEND_RUNTIME_OPTIONS=VIRTUAL``, the host's
``/dev/vdavinci100`` as ``/dev/davinci100`` and the shared nodes, and no other chip's node. The
whole-chip Configuration beside it serves chip 1 only: chip 0 is split. A fault on chip 0 then
takes its vNPU off the Node's allocatable and leaves chip 1.

Stands in for real parts: the NPUs. The node's DCMI library is tests/harness/ascend_dcmi's
stand-in (Huawei's signatures and vdevice structs) with chip 0 split into a ``vir04`` (vNPU 100)
and a ``vir02`` (vNPU 101); the device nodes are character devices made with ``mknod`` in the
node's own ``/dev``. Everything else is real: the agent loads the library through ctypes and
serves the device plugins, the scheduler places the Job's pod by the Node's allocatable, the
kubelet allocates, containerd creates the nodes in the container.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crds.naming import instance_name
from tests.harness.ascend_node import SHARED_NODES, AscendNode, SimChip, SimVnpu, dcmi_library
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import END_MARK, ENV_MARK, deployed, logged_env, plane
from tests.harness.realnode_images import BUSYBOX_IMAGE

__all__ = ["dcmi_library", "plane"]  # the fixtures

pytestmark = pytest.mark.timeout(900)
ZERO, NULL = (1, 5), (1, 3)  # the NPU nodes read as /dev/zero, the shared ones as /dev/null
SLOG = "/var/log/npu/conf/slog"  # the sample's log directory from the host
VNPU_RESOURCE = "huawei.com/Ascend910-4c"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, dcmi_library: Path) -> AscendNode:
    chips = [SimChip(card=i, dev=0, logic=i, phy=i, name="910ProB", aicore=32, hbm_mb=32768)
             for i in range(2)]
    vnpus = [SimVnpu(0, 0, 100, "vir04", 4, 4096), SimVnpu(0, 0, 101, "vir02", 2, 2048,
                                                           vgroup=1)]
    return AscendNode(tmp_path_factory.mktemp("ascend") / "host", chips, library=dcmi_library,
                      vnpus=vnpus)


@pytest.fixture(scope="module")
def npu_node(plane: ControlPlane, host: AscendNode,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    nodes = {name: ZERO for name in ("davinci0", "davinci1", "vdavinci100", "vdavinci101")}
    real = RealNode(plane, node_name=f"vnpu-{uuid.uuid4().hex[:6]}",
                    dev_nodes=nodes | dict.fromkeys(SHARED_NODES, NULL),
                    host_dirs={SLOG: tmp_path_factory.mktemp("slog")})
    real.start()
    try:
        yield real
    finally:
        real.cleanup()


def configuration(name: str, host: AscendNode, resource: str, **fields: object
                  ) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {"discoveryHandler": {"name": "ascend",
                                      "discoveryDetails": host.details(**fields)},
                 "capacity": 1, "resourceName": resource, "allocator": "devicePlugin"},
    }


def huawei_vnpu_job(proof: str) -> dict[str, Any]:
    """Huawei's inference Job sample as their vNPU guide has it changed (the resource), with
    this machine's image and a command that prints the container's env and ``proof``."""
    script = f"echo {ENV_MARK}; env | sort; {proof}; echo {END_MARK}"
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "resnetinfer1-1"},
        "spec": {"template": {"spec": {
            "automountServiceAccountToken": False,
            "containers": [{
                "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "name": "resnet50infer",
                "command": ["sh", "-c", script],
                "resources": {"requests": {VNPU_RESOURCE: 1}, "limits": {VNPU_RESOURCE: 1}},
                "volumeMounts": [{"name": "slog", "mountPath": SLOG + "/"},
                                 {"name": "localtime", "mountPath": "/etc/localtime"}],
            }],
            "volumes": [{"name": "slog", "hostPath": {"path": SLOG + "/"}},
                        {"name": "localtime", "hostPath": {"path": "/etc/localtime"}}],
            "restartPolicy": "OnFailure",
        }}},
    }


def allocatable(plane: ControlPlane, node: str) -> dict[str, str]:
    out = plane.kubectl("get", "node", node, "-o", "json").stdout
    return dict(json.loads(out)["status"].get("allocatable") or {})


async def test_huaweis_vnpu_job_gets_the_vnpu_as_huaweis_plugin_gives_it(
    plane: ControlPlane, npu_node: RealNode, host: AscendNode, tmp_path: Path,
) -> None:
    vnpu_cfg = configuration("npu-4c", host, VNPU_RESOURCE, vnpuType="Ascend910-4c")
    chips_cfg = configuration("npu", host, "huawei.com/Ascend910")
    first = instance_name("npu-4c", "vdavinci100", shared=False, node=npu_node.node_name)
    started = time.monotonic()
    with deployed(plane, npu_node, tmp_path, vnpu_cfg, first, agent_env=host.env,
                  before=[chips_cfg]) as broker:
        def offered() -> dict[str, str] | None:
            found = allocatable(plane, npu_node.node_name)
            wanted = found.get(VNPU_RESOURCE) == "1" and found.get("huawei.com/Ascend910") == "1"
            return found if wanted else None

        counts = await until(offered, within=120,
                             what="the Node offering one Ascend910-4c vNPU and one whole chip")
        assert "huawei.com/Ascend910-2c" not in counts, "no Configuration serves the vir02"
        print(f"figure: Configurations applied -> Node offers the vNPU "
              f"{time.monotonic() - started:.1f} s")
        proof = ("ls -l /dev/ | grep -E ' (v?davinci|devmm_svm|hisi_hdc)'; "
                 "echo edgeplug-read:$(head -c 4 /dev/davinci$ASCEND_VISIBLE_DEVICES | od -An "
                 "-tx1)")
        job = huawei_vnpu_job(proof)
        job["metadata"]["namespace"] = broker.namespace
        plane.kubectl("apply", "-f", "-", stdin=json.dumps(job))

        def logs() -> str | None:
            out = plane.kubectl("logs", "-n", broker.namespace, "job/resnetinfer1-1",
                                check=False).stdout
            return out if END_MARK in out else None

        out = await until(logs, what="the Job's container output", within=180)
        print(f"--- job log ---\n{out}")
        env = logged_env(out)
        assert env["ASCEND_VISIBLE_DEVICES"] == "100"
        assert env["ASCEND_RUNTIME_OPTIONS"] == "VIRTUAL"
        assert "ASCEND_DEVICE_ID" not in env
        listed = {line.split()[-1]: line for line in out.splitlines() if line.startswith("c")}
        assert set(listed) == {"davinci100", *SHARED_NODES}, \
            "the vNPU as /dev/davinci100 and the shared nodes, no chip, no vdavinci"
        assert " 1,   5 " in listed["davinci100"], "the host's /dev/vdavinci100 (here /dev/zero)"
        assert "edgeplug-read: 00 00 00 00" in out, "the vNPU's node opened and read"

        # Health per vNPU is its chip's: a fault on chip 0 takes its vNPU off the Node, and
        # leaves chip 1 (served whole) as it was.
        host.fault(0)

        def vnpu_withdrawn() -> dict[str, str] | None:
            found = allocatable(plane, npu_node.node_name)
            gone = found.get(VNPU_RESOURCE) == "0" and found.get("huawei.com/Ascend910") == "1"
            return found if gone else None

        await until(vnpu_withdrawn, within=60,
                    what="chip 0's fault taking its vNPU off the Node's allocatable")
