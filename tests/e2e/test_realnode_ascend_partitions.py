"""On a real node: a pod holding a 2-core partition of an Ascend chip runs and sees its vNPU.

The agent runs beside the kubelet with ``DRA=on`` and offers the node's 310P chip as
``Ascend310P-2c`` partitions (``vnpuPartitions``). A pod asks for one through a
ResourceClaimTemplate selecting the type by attribute: the real kube-controller-manager makes
the claim, the real kube-scheduler allocates a partition against the chip's counters, the real
kubelet's DRA manager calls the agent's ``NodePrepareResources``, which creates the vNPU on the
chip (DCMI's ``dcmi_create_vdevice``, template ``vir02``) and answers the claim's CDI device,
which containerd resolves. The container must see what Huawei's plugin gives for a vNPU:
``ASCEND_VISIBLE_DEVICES=<vNPU id>``, ``ASCEND_RUNTIME_OPTIONS=VIRTUAL``, the host's
``/dev/vdavinci<id>`` as ``/dev/davinci<id>`` and the shared nodes. The pod deleted, the
kubelet unprepares the claim and the vNPU is destroyed.

Stands in for real parts: the NPU. The node's DCMI library is tests/harness/ascend_dcmi's
stand-in (Huawei's signatures and vdevice structs; it numbers the vNPUs it creates from 100),
and the vNPU's node on the real node is a character device made with ``mknod`` beforehand
(the stand-in, unprivileged, creates it in the handler's host tree only). Everything else is
real.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from crds import dra
from tests.harness import dra as h
from tests.harness.ascend_node import SHARED_NODES, AscendNode, SimChip, dcmi_library
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until, wait_service_account
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    END_MARK,
    Broker,
    broker_spec,
    logged_env,
    plane,
    start_agent,
)

__all__ = ["dcmi_library", "plane"]  # the fixtures

pytestmark = pytest.mark.timeout(900)
ZERO, NULL = (1, 5), (1, 3)  # the NPU nodes read as /dev/zero, the shared ones as /dev/null
FIRST_VNPU = 100  # the stand-in's first vNPU id
REGISTERED = "DRA plugin registered with the kubelet"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, dcmi_library: Path) -> AscendNode:
    chip = SimChip(card=0, dev=0, logic=0, phy=0, name="310P3", aicore=8, hbm_mb=0,
                   mem_mb=24576)
    return AscendNode(tmp_path_factory.mktemp("ascend") / "host", [chip], library=dcmi_library)


@pytest.fixture(scope="module")
def npu_node(plane: ControlPlane) -> Iterator[RealNode]:
    nodes = {"davinci0": ZERO, f"vdavinci{FIRST_VNPU}": ZERO}
    real = RealNode(plane, node_name=f"split-{uuid.uuid4().hex[:6]}",
                    dev_nodes=nodes | dict.fromkeys(SHARED_NODES, NULL))
    real.start()
    try:
        yield real
    finally:
        real.cleanup()


def claiming_pod(name: str, template: str, proof: str) -> dict[str, Any]:
    """The brokers' busybox (prints its env and ``proof``) as a pod holding one claim."""
    spec = broker_spec(proof)
    spec["resourceClaims"] = [{"name": "npu", "resourceClaimTemplateName": template}]
    spec["containers"][0]["resources"] = {"claims": [{"name": "npu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_a_pod_holding_a_2c_partition_runs_with_its_vnpu(
    plane: ControlPlane, npu_node: RealNode, host: AscendNode,
) -> None:
    ns = f"split-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    agent_log = f"agent-{ns}"
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    try:
        await wait_service_account(kube, ns)
        start_agent(npu_node, plane, Broker(ns, "", "", agent_log),
                    extra_env={"DRA": "on", **host.env})
        async with h.device_classes(kube, ns):
            h.apply(plane, ns, {
                "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
                "metadata": {"name": "npu"},
                "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails":
                                              host.details(vnpuPartitions=["Ascend310P-2c"])},
                         "capacity": 1, "allocator": "dra"}})
            await until(lambda: REGISTERED in npu_node.log_tail(agent_log, 1000),
                        what="the agent's DRA plugin registered with the kubelet", within=60)
            attr = f'device.attributes["{dra.DRIVER}"]'
            cel = f'"ascend_vnpu_type" in {attr} && {attr}.ascend_vnpu_type == "Ascend310P-2c"'
            proof = "ls -l /dev/ | grep -E ' (v?davinci|devmm_svm|hisi_hdc)'"
            started = time.monotonic()
            h.apply(plane, ns, h.claim_template("two", dra.device_class_name(ns, "npu"), cel),
                    claiming_pod("user", "two", proof))
            out = await until(lambda: _logs(plane, ns, "user"), within=180,
                              what="pod user running with its partition, its env in its log")
            print(f"figure: claim template + pod applied -> the vNPU's container printed "
                  f"{time.monotonic() - started:.1f} s\n--- pod log ---\n{out}")
            assert host.created_vnpus() == [(0, 0, FIRST_VNPU, "vir02")]
            env = logged_env(out)
            assert env["ASCEND_VISIBLE_DEVICES"] == str(FIRST_VNPU)
            assert env["ASCEND_RUNTIME_OPTIONS"] == "VIRTUAL"
            listed = {line.split()[-1]: line for line in out.splitlines()
                      if line.startswith("c")}
            assert set(listed) == {f"davinci{FIRST_VNPU}", *SHARED_NODES}, \
                "the vNPU as /dev/davinci<id> and the shared nodes, not the chip"
            assert " 1,   5 " in listed[f"davinci{FIRST_VNPU}"], "the host's /dev/vdavinci100"

            plane.kubectl("delete", "pod", "user", "-n", ns, "--wait=false")
            await until(lambda: host.created_vnpus() == [] or None, within=120,
                        what="the kubelet unpreparing the claim and the vNPU destroyed")
    finally:
        npu_node.stop_process(agent_log)
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        print(f"--- agent log ---\n{npu_node.log_tail(agent_log, 40)}")
        await kube.close()


def _logs(plane: ControlPlane, ns: str, pod: str) -> str | None:
    out = plane.kubectl("logs", "-n", ns, pod, check=False).stdout
    return out if END_MARK in out else None
